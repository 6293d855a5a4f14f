"""Where a checkpoint lies: a file, a training run's ``step-N`` directory, or the run directory itself.

A training run (the train plugin) writes ``<run>/checkpoints/step-NNNNNNN/`` directories,
each holding ``model.safetensors``, and a ``<run>/checkpoints/latest`` file naming the
newest complete one. Every command that reads a checkpoint takes any of

- a checkpoint file (``.safetensors``), used as it is;
- a ``step-N`` directory: its ``model.safetensors`` (a sharded one without it is refused
  naming ``specformer checkpoint consolidate``, which writes that file: only the train
  plugin reads shards);
- a run directory: its latest checkpoint, the one ``--resume`` starts from (what
  ``latest`` names, else the newest ``step-N``), else its final ``model.safetensors``.

The layout itself (:func:`checkpoint_root`, :func:`step_dirs`, :func:`resume_candidates`)
lives here, under the train plugin, so that resuming and reading pick the same checkpoint.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

from specformer.errors import CheckpointError

CHECKPOINTS = "checkpoints"
LATEST = "latest"
#: The weights file of a checkpoint directory, and the final model of a run directory.
WEIGHTS = "model.safetensors"
#: The index of a sharded checkpoint directory (the train plugin's ``train.checkpoint_format: sharded``).
SHARDED_INDEX = "sharded.json"
STEP_DIR = re.compile(r"^step-(\d+)$")

#: What a checkpoint argument may be, for messages.
ACCEPTED = "a .safetensors checkpoint, a run's checkpoints/step-N directory, or a run directory"


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / CHECKPOINTS


def step_name(step: int) -> str:
    return f"step-{step:07d}"


def step_dirs(out_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoint directories, oldest first."""
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_name(out_dir: str | Path) -> str | None:
    """What ``latest`` says (None without a readable ``latest``)."""
    pointer = checkpoint_root(out_dir) / LATEST
    try:
        return pointer.read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def latest_checkpoint(out_dir: str | Path) -> Path | None:
    """The directory ``latest`` names, or None when the run has no checkpoint yet (or it is missing)."""
    name = latest_name(out_dir)
    if name is None or not STEP_DIR.match(name):
        return None
    target = checkpoint_root(out_dir) / name
    return target if target.is_dir() else None


def resume_candidates(out_dir: str | Path) -> list[Path]:
    """Checkpoint directories of a run, best first: ``latest``'s, then older ones newest first.

    Checkpoints newer than ``latest`` belong to a timeline that a resume abandoned and are left out;
    without a readable ``latest``, every checkpoint counts. The first may be missing (``latest``
    naming a deleted directory): callers try them in order.
    """
    root = checkpoint_root(out_dir)
    named = latest_name(out_dir)
    match = STEP_DIR.match(named) if named else None
    if match is None:
        return [path for _, path in reversed(step_dirs(out_dir))]
    limit = int(match.group(1))
    return [root / named, *(path for step, path in reversed(step_dirs(out_dir)) if step < limit)]


def checkpoint_directory(path: str | Path) -> Path:
    """A run directory's latest checkpoint directory (the first of :func:`resume_candidates` that exists); any other
    path, or a run directory without a checkpoint yet, as it is."""
    path = Path(path)
    if checkpoint_root(path).is_dir():
        newest = next((candidate for candidate in resume_candidates(path) if candidate.is_dir()), None)
        if newest is not None:
            return newest
    return path


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint file ``path`` stands for (see the module doc); CheckpointError, one line, for a directory
    holding none. A path that is not a directory is returned as it is: the reader names what is wrong with it."""
    path = Path(path)
    if not os.path.isdir(path):  # os.path's: False, not an OSError, for a name too long to look up
        return path
    directory = checkpoint_directory(path)
    if directory == path and checkpoint_root(path).is_dir() and not (path / WEIGHTS).is_file():
        raise CheckpointError(f"{path}: a run directory without a checkpoint yet (no step-N directory in "
                              f"{checkpoint_root(path)}); give {ACCEPTED}")
    return _in_checkpoint_dir(directory)


def _in_checkpoint_dir(directory: Path) -> Path:
    if (directory / WEIGHTS).is_file():  # a full checkpoint, or a sharded one consolidated in place
        return directory / WEIGHTS
    if (directory / SHARDED_INDEX).is_file():
        raise CheckpointError(f"{directory}: a sharded training checkpoint; write its single file with "
                              f"`specformer checkpoint consolidate {shlex.quote(str(directory))}` and give that")
    raise CheckpointError(f"{directory}: a directory without a checkpoint (no {WEIGHTS}, no {CHECKPOINTS}/); "
                          f"give {ACCEPTED}")


__all__ = ["ACCEPTED", "CHECKPOINTS", "LATEST", "SHARDED_INDEX", "STEP_DIR", "WEIGHTS", "checkpoint_directory",
           "checkpoint_root", "latest_checkpoint", "latest_name", "resolve_checkpoint", "resume_candidates", "step_dirs", "step_name"]
