"""specformer.files.outputs: the one rule for what a command writes, on plain files and folders.

An input is recognised however the output names it (``./a/../a``, a symbolic link, a hard
link); a folder to be replaced may not hold an input; an existing output needs ``force``;
a staged folder replaces the old one only once complete, and a failure leaves the old one.
Every command's use of it is tried in ``tests/core/cli/test_cli_outputs.py``.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from specformer.files import outputs
from specformer.errors import UserError
from specformer.files.outputs import (check_file_output, check_folder_output, lies_inside, refuse_inputs, same_file,
                                staged_folder, write_text_output)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "in.bin").write_bytes(b"precious")
    return folder / "in.bin"


def _spellings(path: Path, tmp_path: Path) -> dict[str, Path]:
    """Other names for ``path``: through ``..``, a symbolic link, a hard link (files only)."""
    links = tmp_path / "links"
    links.mkdir(exist_ok=True)
    names = {"up and back": path.parent / ".." / path.parent.name / "." / path.name,
             "symlink": links / f"sym-{path.name}"}
    names["symlink"].symlink_to(path)
    if path.is_file():
        names["hard link"] = links / f"hard-{path.name}"
        os.link(path, names["hard link"])
    return names


def test_same_file_sees_through_spellings_and_links(data, tmp_path, monkeypatch):
    for label, other in _spellings(data, tmp_path).items():
        assert same_file(other, data) and same_file(data, other), label
    monkeypatch.chdir(data.parent)
    assert same_file("./in.bin", data)
    (tmp_path / "copy.bin").write_bytes(data.read_bytes())
    assert not same_file(tmp_path / "copy.bin", data)  # equal bytes are not the same file
    assert not same_file(tmp_path / "missing-a", tmp_path / "missing-b")


def test_hard_links_are_the_same_file_only_by_inode(data, tmp_path):
    link = tmp_path / "link.bin"
    os.link(data, link)
    assert link.resolve() != data.resolve()  # the path comparison alone would miss it
    assert same_file(link, data)


def test_lies_inside(data, tmp_path):
    folder = data.parent
    assert lies_inside(data, folder) and lies_inside(folder, folder)
    assert lies_inside(data, tmp_path) and not lies_inside(folder, data)
    assert not lies_inside(tmp_path / "data-2" / "x", folder)  # a shared prefix is not containment
    (tmp_path / "via").symlink_to(folder)
    assert lies_inside(tmp_path / "via" / "in.bin", folder) and lies_inside(data, tmp_path / "via")


def test_an_input_is_refused_as_the_output_however_it_is_named(data, tmp_path, monkeypatch):
    for label, other in _spellings(data, tmp_path).items():
        with pytest.raises(UserError, match="an input of this command.*--force never replaces an input"):
            check_file_output(other, inputs=[data], force=True)
        with pytest.raises(UserError, match="an input of this command"):
            check_file_output(data, inputs=[other], force=True)  # and the other way round
    monkeypatch.chdir(data.parent)
    with pytest.raises(UserError, match=r"^in\.bin: is .*/data/in\.bin \(the same file\), an input of this command"):
        check_file_output("./in.bin", inputs=[data], force=True)
    assert data.read_bytes() == b"precious"


def test_a_folder_holding_an_input_is_refused(data, tmp_path):
    folder = data.parent
    for target in (folder, tmp_path, *_spellings(folder, tmp_path).values()):
        with pytest.raises(UserError, match="holds .*in.bin, an input of this command, which replacing it would delete"):
            check_folder_output(target, inputs=[data], force=True)
    with pytest.raises(UserError, match="an input of this command"):
        refuse_inputs([tmp_path / "out", folder], [None, tmp_path / "other", data])
    refuse_inputs([tmp_path / "out"], [data, folder, None])  # beside the inputs is fine
    check_folder_output(tmp_path / "out", inputs=[data], force=False)


def test_refusals_name_what_to_do_instead(data):
    with pytest.raises(UserError, match=r"in\.bin: is also an input of this command; move it \(--overwrite never"):
        refuse_inputs([data], [data], instead="move it", flag="--overwrite")


def test_an_existing_file_is_replaced_only_with_force(tmp_path):
    out = tmp_path / "out.txt"
    out.write_text("mine")
    with pytest.raises(UserError, match="out.txt: already exists; pass --force to replace it"):
        write_text_output(out, "new", force=False)
    assert out.read_text() == "mine"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match="already exists"):
        check_file_output(dangling, force=False)
    write_text_output(out, "new", force=True)
    assert out.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "out.txt"]
    (tmp_path / "link.txt").symlink_to(out)
    write_text_output(tmp_path / "link.txt", "newer", force=True)  # the link itself is replaced, not what it names
    assert out.read_text() == "new" and (tmp_path / "link.txt").read_text() == "newer"
    with pytest.raises(UserError, match="is a folder; give a file name"):
        check_file_output(tmp_path, force=True)
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "to-pipe").symlink_to(tmp_path / "pipe")
    for special in ("pipe", "to-pipe"):  # never renamed over: /dev/null would become a plain file
        with pytest.raises(UserError, match="is not a regular file"):
            check_file_output(tmp_path / special, force=True)
    with pytest.raises(UserError, match=f"the folder {tmp_path / 'no'} does not exist"):
        check_file_output(tmp_path / "no" / "x", force=False)


def test_folder_targets(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    check_folder_output(tmp_path / "empty", force=False)  # an empty folder counts as absent
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "a").write_text("a")
    with pytest.raises(UserError, match="already holds files; choose a new or empty folder, or pass --force"):
        check_folder_output(tmp_path / "full", force=False)
    check_folder_output(tmp_path / "full", force=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="exists and is not a folder"):
        check_folder_output(tmp_path / "file", force=True)
    with pytest.raises(UserError, match="does not exist"):
        check_folder_output(tmp_path / "a" / "b", force=False)
    check_folder_output(tmp_path / "a" / "b", force=False, parents=True)
    with pytest.raises(UserError, match="file is not a folder"):
        check_folder_output(tmp_path / "file" / "b", force=False, parents=True)
    monkeypatch.chdir(tmp_path / "full")
    with pytest.raises(UserError, match="is the current folder or one above it"):
        check_folder_output(tmp_path, force=True)


def _listing(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_staged_folder_replaces_the_old_one_whole(tmp_path):
    old = tmp_path / "out"
    old.mkdir()
    (old / "stale.txt").write_text("from another model")
    with staged_folder(old, force=True) as stage:
        assert stage.parent == tmp_path and stage.name.startswith(".out.partial-")
        (stage / "new.txt").write_text("new")
        assert _listing(old) == {"stale.txt": b"from another model"}  # untouched until the block ends
    assert _listing(old) == {"new.txt": b"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_staged_folder_makes_missing_parents(tmp_path):
    with staged_folder(tmp_path / "a" / "b" / "out", force=False, parents=True) as stage:
        (stage / "x").write_text("x")
    assert _listing(tmp_path) == {"a/b/out/x": b"x"}


@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), RuntimeError("a bug")])
def test_a_failure_inside_a_staged_folder_leaves_the_old_one(tmp_path, failure):
    old = tmp_path / "out"
    old.mkdir()
    (old / "keep.txt").write_text("keep")
    expected = UserError if isinstance(failure, OSError) else RuntimeError
    with pytest.raises(expected) as caught:
        with staged_folder(old, force=True) as stage:
            (stage / "half.txt").write_text("half")
            raise failure
    if expected is UserError:
        assert str(caught.value) == f"{old}: could not be written (No space left on device); nothing was changed"
    assert _listing(old) == {"keep.txt": b"keep"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_staged_folder_checks_again_before_the_rename(tmp_path, data):
    # The input (named through a link) came to lie in the output folder while the work ran: the
    # rename is refused and the input kept.
    out, via = tmp_path / "out", tmp_path / "via"
    via.symlink_to(data.parent)
    with pytest.raises(UserError, match="holds .*via/in.bin, an input of this command"):
        with staged_folder(out, inputs=[via / "in.bin"], force=True) as stage:
            (stage / "new.txt").write_text("new")
            data.parent.rename(out)
            via.unlink()
            via.symlink_to(out)
    assert _listing(out) == {"in.bin": b"precious"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "via"]


def test_a_failed_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    old = tmp_path / "out"
    old.mkdir()
    (old / "keep.txt").write_text("keep")
    real = os.rename

    def failing(src, dst):
        if Path(src).name.startswith(".out.partial-"):
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real(src, dst)

    monkeypatch.setattr(outputs.os, "rename", failing)
    with pytest.raises(UserError, match="could not be moved into place"):
        with staged_folder(old, force=True) as stage:
            (stage / "new.txt").write_text("new")
    assert _listing(old) == {"keep.txt": b"keep"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_write_failures_are_one_user_error(tmp_path):
    with pytest.raises(UserError, match=r"x: could not be written \(Permission denied\); nothing was changed"):
        with outputs.writing(tmp_path / "x"):
            raise PermissionError(errno.EACCES, "Permission denied")
