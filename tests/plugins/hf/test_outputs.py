"""What import and export write: refused over existing work unless --force, complete or not at all.

An export goes into a temporary sibling folder that is renamed into place when complete;
with --force the old folder is replaced only then. Output problems (a missing parent, a
folder that cannot be written, a full disk) exit 2 with one line, before weights are read
where they can be checked up front, and never leave a half-written file where a good one was.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import hf_forge
import pytest
import torch

import specformer
import specformer_hf
from specformer.cli.main import main
from specformer.errors import UserError


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    d = hf_forge.llama_folder(tmp_path_factory.mktemp("src") / "llama")
    out = d.parent / "llama.safetensors"
    assert main(["hf", "import", str(d), str(out)]) == 0
    return out


def _listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _siblings(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir())


def _previous_export(tmp_path: Path) -> Path:
    """A folder holding another model's export, with a stale shard and tokenizer."""
    old = tmp_path / "out"
    old.mkdir()
    (old / "config.json").write_text('{"model_type": "gpt2"}')
    (old / "model-00002-of-00002.safetensors").write_bytes(b"stale shard")
    (old / "tokenizer.json").write_text("{}")
    return old


def _error(capsys) -> str:
    """The one error line (warnings about the source folder may come before it)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if not line.startswith("warning: ")]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


# -- export ---------------------------------------------------------------------------------


def test_export_into_a_folder_holding_files_is_refused_and_leaves_it_alone(checkpoint, tmp_path, capsys):
    old = _previous_export(tmp_path)
    before = _listing(old)
    assert main(["hf", "export", str(checkpoint), str(old)]) == 2
    err = _error(capsys)
    assert "already holds files" in err and "pass --force to replace this one" in err
    assert _listing(old) == before
    assert _siblings(old) == ["out"]  # no temporary folder left behind


def test_export_with_force_replaces_the_whole_folder(checkpoint, tmp_path, capsys):
    old = _previous_export(tmp_path)
    assert main(["hf", "export", str(checkpoint), str(old), "--force"]) == 0
    capsys.readouterr()
    names = set(_listing(old))
    assert "model-00002-of-00002.safetensors" not in names and "tokenizer.json" not in names
    assert {"config.json", "model.safetensors"} <= names
    assert json.loads((old / "config.json").read_text())["model_type"] == "llama"
    assert _siblings(old) == ["out"]
    again = specformer_hf.from_hf(old)
    for name, tensor in specformer.load(checkpoint).state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def test_export_into_an_empty_folder_is_fine(checkpoint, tmp_path):
    (tmp_path / "out").mkdir()
    assert main(["hf", "export", str(checkpoint), str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()


@pytest.mark.parametrize("force", [False, True])
def test_an_export_that_fails_while_writing_changes_nothing(checkpoint, tmp_path, monkeypatch, force):
    import specformer_hf.exporter as exporter

    def disk_full(tensors, path, metadata):
        Path(path).write_bytes(b"half a file")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(exporter, "write_safetensors_atomic", disk_full)
    model = specformer.load(checkpoint)
    if force:
        target = _previous_export(tmp_path)
        before = _listing(target)
    else:
        target = tmp_path / "out"
    with pytest.raises(UserError, match=r"out: could not be written \(No space left on device\); nothing was changed"):
        specformer_hf.to_hf(model, target, force=force)
    if force:
        assert _listing(target) == before  # the previous export is intact
        assert _siblings(target) == ["out"]
    else:
        assert not target.exists() and list(tmp_path.iterdir()) == []


def test_the_old_folder_is_replaced_only_after_the_new_one_is_complete(checkpoint, tmp_path, monkeypatch):
    # Watch the renames: the old folder is moved aside only when the new one holds every file.
    import os

    import specformer.files.outputs as output

    old = _previous_export(tmp_path)
    seen = []
    real = os.rename

    def watching(src, dst):
        seen.append((Path(src).name, Path(dst).name, sorted(p.name for p in Path(src).iterdir())))
        real(src, dst)

    monkeypatch.setattr(output.os, "rename", watching)
    specformer_hf.to_hf(specformer.load(checkpoint), old, force=True)
    (aside_src, aside_dst, aside_files), (new_src, new_dst, new_files) = seen
    assert aside_src == "out" and aside_dst.startswith(".out.old-") and "tokenizer.json" in aside_files
    assert new_src.startswith(".out.partial-") and new_dst == "out" and new_files == ["config.json", "generation_config.json", "model.safetensors"]


def test_export_output_problems_are_found_before_loading_the_checkpoint(tmp_path, capsys):
    missing = tmp_path / "no" / "such" / "out"
    # The checkpoint does not exist either: the output is checked first, so that is what is reported.
    assert main(["hf", "export", str(tmp_path / "c.safetensors"), str(missing)]) == 2
    assert f"the folder {missing.parent} does not exist" in _error(capsys)
    (tmp_path / "file").write_text("x")
    assert main(["hf", "export", str(tmp_path / "c.safetensors"), str(tmp_path / "file")]) == 2
    assert "exists and is not a folder" in _error(capsys)


def test_unwritable_output_folder_is_one_line(checkpoint, tmp_path, monkeypatch, capsys):
    # Root ignores permission bits, so the refusal is simulated where the probe creates its entry.
    real = Path.mkdir

    def read_only(self, *args, **kwargs):
        if self.parent == tmp_path:
            raise PermissionError(errno.EROFS, "Read-only file system")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(["hf", "export", str(checkpoint), str(tmp_path / "out")]) == 2
    assert f"cannot write in {tmp_path} (Read-only file system)" in _error(capsys)
    assert main(["hf", "import", str(checkpoint.parent / "llama"), str(tmp_path / "m.safetensors")]) == 2
    assert f"cannot write in {tmp_path} (Read-only file system)" in _error(capsys)


@pytest.mark.skipif(not hasattr(__import__("os"), "geteuid") or __import__("os").geteuid() == 0,
                    reason="root writes into read-only folders")
def test_read_only_folder_for_real(checkpoint, tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["hf", "export", str(checkpoint), str(locked / "out")]) == 2
    assert "cannot write in" in _error(capsys)


def test_force_never_deletes_the_checkpoint_being_exported_or_the_current_folder(checkpoint, tmp_path, monkeypatch, capsys):
    import shutil

    here = tmp_path / "work"
    here.mkdir()
    shutil.copy(checkpoint, here / "c.safetensors")
    assert main(["hf", "export", str(here / "c.safetensors"), str(here), "--force"]) == 2
    assert f"{here}: holds {here / 'c.safetensors'}, an input of this command" in _error(capsys)
    monkeypatch.chdir(here / "..")
    with pytest.raises(UserError, match="is the current folder or one above it"):
        specformer_hf.to_hf(specformer.load(checkpoint), Path("."), force=True)
    assert (here / "c.safetensors").is_file()


# -- import ---------------------------------------------------------------------------------


def test_import_refuses_to_overwrite_the_checkpoint_or_spec_without_force(checkpoint, tmp_path, capsys):
    source = checkpoint.parent / "llama"
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"someone's checkpoint")
    assert main(["hf", "import", str(source), str(out)]) == 2
    assert f"{out}: already exists; pass --force to replace it" in _error(capsys)
    assert out.read_bytes() == b"someone's checkpoint"

    out.unlink()
    (tmp_path / "m.yaml").write_text("mine")
    assert main(["hf", "import", str(source), str(out)]) == 2
    assert "m.yaml: already exists" in _error(capsys)
    assert not out.exists()  # refused before anything was written

    assert main(["hf", "import", str(source), str(out), "--force"]) == 0
    assert specformer.load(out).num_parameters() == specformer.load(checkpoint).num_parameters()
    assert (tmp_path / "m.yaml").read_text().startswith("# Imported by")


def test_import_spec_out_with_a_missing_parent_fails_before_any_work(checkpoint, tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    assert main(["hf", "import", str(checkpoint.parent / "llama"), str(out), "--spec-out", str(tmp_path / "no" / "m.yaml")]) == 2
    assert f"the folder {tmp_path / 'no'} does not exist" in _error(capsys)
    assert not out.exists()
    assert main(["hf", "import", str(checkpoint.parent / "llama"), str(tmp_path / "no" / "m.safetensors")]) == 2
    assert "does not exist" in _error(capsys)


def test_import_that_fails_while_saving_keeps_the_old_checkpoint(checkpoint, tmp_path, monkeypatch, capsys):
    import specformer.checkpoint.file as core_checkpoint_file

    out = tmp_path / "m.safetensors"
    out.write_bytes(b"previous")

    def disk_full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(core_checkpoint_file, "save_file", disk_full)
    assert main(["hf", "import", str(checkpoint.parent / "llama"), str(out), "--force"]) == 2
    assert "could not be written (No space left on device)" in _error(capsys)
    assert out.read_bytes() == b"previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]
