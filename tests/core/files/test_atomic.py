"""specformer.files.atomic: a file is replaced whole or not at all, and gets the umask's mode whoever filled it.

safetensors writes its files 0600; a checkpoint saved by specformer must get what any
other tool's new file gets (0o666 less the umask), under any umask. The commands' files
are checked the same way in ``tests/core/cli/test_cli_outputs.py``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import torch
from conftest import TINY

import specformer
from specformer.files.atomic import copy_file_atomic, replacing, write_text_atomic
from specformer.checkpoint.save_load import write_safetensors_atomic

UMASKS = (0o022, 0o077)


@pytest.fixture(params=UMASKS, ids=lambda m: f"umask-{m:03o}")
def umask(request):
    """Runs the test under this umask (process-wide, so restored at once)."""
    before = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(before)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_specformer_save_follows_the_umask(tmp_path, umask):
    path = specformer.save(specformer.build(TINY, seed=0), tmp_path / "sub" / "m.safetensors")
    assert _mode(path) == 0o666 & ~umask
    assert _mode(path.parent) == 0o777 & ~umask
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.safetensors"]


def test_every_atomic_writer_follows_the_umask(tmp_path, umask):
    write_text_atomic(tmp_path / "a.txt", "a")
    copy_file_atomic(tmp_path / "a.txt", tmp_path / "b.txt")
    write_safetensors_atomic({"x": torch.zeros(2)}, tmp_path / "c.safetensors", {"format": "pt"})
    with replacing(tmp_path / "d.bin") as tmp:
        tmp.write_bytes(b"d")
        os.chmod(tmp, 0o600)  # whatever the writer leaves
    for name in ("a.txt", "b.txt", "c.safetensors", "d.bin"):
        assert _mode(tmp_path / name) == 0o666 & ~umask, name


def test_replacing_an_existing_file_gives_it_the_new_files_mode(tmp_path, umask):
    old = tmp_path / "m.bin"
    old.write_bytes(b"old")
    os.chmod(old, 0o640)
    with replacing(old) as tmp:
        tmp.write_bytes(b"new")
    assert old.read_bytes() == b"new" and _mode(old) == 0o666 & ~umask


def test_a_failure_while_writing_leaves_the_old_file(tmp_path):
    old = tmp_path / "m.safetensors"
    old.write_bytes(b"the old checkpoint")
    with pytest.raises(RuntimeError, match="the writer broke"):
        with replacing(old) as tmp:
            tmp.write_bytes(b"half a checkp")
            raise RuntimeError("the writer broke")
    assert old.read_bytes() == b"the old checkpoint"
    assert [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_a_failed_save_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    import specformer.checkpoint.file as checkpoint_file

    path = specformer.save(specformer.build(TINY, seed=0), tmp_path / "m.safetensors")
    before = path.read_bytes()

    def dies_halfway(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint_file, "save_file", dies_halfway)
    with pytest.raises(OSError, match="No space left"):
        specformer.save(specformer.build(TINY, seed=1), path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.safetensors"]


def test_the_temporary_is_a_hidden_sibling_unique_to_the_call(tmp_path):
    with replacing(tmp_path / "m.bin") as first, replacing(tmp_path / "m.bin") as second:
        assert first != second and first.parent == tmp_path == second.parent
        assert first.name.startswith(f".m.bin.tmp-{os.getpid()}-") and first.exists()
        first.write_bytes(b"1")
        second.write_bytes(b"2")
    assert (tmp_path / "m.bin").read_bytes() == b"1"  # the last rename wins; both temporaries are gone
    assert [p.name for p in tmp_path.iterdir()] == ["m.bin"]
