"""Checks on the run directory before any expensive work: writable, free space, no earlier run or input overwritten.

A run that would fail to save its first checkpoint an hour in is refused at the start:
the directory must take a file, and its disk must hold the checkpoints the run will
keep (``keep_last + 1`` at the moment a new one is written, then the final copy of the
weights). A fresh start into a directory holding an earlier run's checkpoints or model
is refused unless ``--overwrite`` says to replace them, so no run is ever lost to a
forgotten ``--resume``. Nor, with either, is an input of the run (the spec, ``--init``,
``--data``, a tokenizer or chat template file) ever one of the files the run writes or
deletes there (:func:`specformer.files.outputs.refuse_inputs`).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from specformer.errors import UserError
from specformer.messages import format_bytes
from specformer.files.atomic import temp_sibling
from specformer.files.outputs import refuse_inputs
from specformer_text import OutputError

from specformer_train.checkpointing import CHECKPOINTS, checkpoint_root, earlier_run_files, step_dirs
from specformer_train.lock import LOCK_FILE
from specformer_train.metrics import METRICS_FILE, PLOT_FILE

#: Bytes per parameter of a training checkpoint: float32 weights and AdamW's two float32 moments.
CHECKPOINT_BYTES_PER_PARAM = 4 * 3
#: Bytes per parameter of the final ``model.safetensors``.
MODEL_BYTES_PER_PARAM = 4
#: What a run writes, replaces or deletes in its directory (``--overwrite`` clears the earlier run's):
#: an input lying there would be lost.
RUN_ENTRIES = (CHECKPOINTS, "model.safetensors", "tokenizer.json", METRICS_FILE, PLOT_FILE, "tensorboard", LOCK_FILE)


def check_writable(run_dir: Path) -> None:
    """Create ``checkpoints/`` and a probe file in it, or raise :class:`OutputError` naming the problem."""
    root = checkpoint_root(run_dir)
    probe = temp_sibling(root / "write-probe")
    try:
        root.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as f:
            f.write(b"0")
    except OSError as exc:
        raise OutputError(f"cannot write to the run directory {run_dir}: {exc.strerror or exc}; "
                          "choose another with --out DIR") from None
    finally:
        probe.unlink(missing_ok=True)


def needed_bytes(n_params: int, *, keep_last: int) -> int:
    return (keep_last + 1) * CHECKPOINT_BYTES_PER_PARAM * n_params + MODEL_BYTES_PER_PARAM * n_params


def check_space(run_dir: Path, *, n_params: int, keep_last: int) -> None:
    """Refuse a run whose checkpoints cannot fit on the run directory's disk."""
    # What is already there is replaced or pruned as the run goes, so it counts as available.
    reusable = sum(_size(path) for _, path in step_dirs(run_dir)) + _size(run_dir / "model.safetensors")
    free = shutil.disk_usage(run_dir).free + reusable
    need = needed_bytes(n_params, keep_last=keep_last)
    if free < need:
        raise OutputError(
            f"the run directory {run_dir} has {_human(free)} free, but {keep_last + 1} checkpoints and the final "
            f"model of {n_params:,} parameters need about {_human(need)}; free some space, lower "
            f"train.keep_last, or choose another disk with --out DIR"
        )


def refuse_earlier_run(run_dir: Path) -> None:
    """A fresh start must not replace an earlier run's results unless told to (``--overwrite``)."""
    found = earlier_run_files(run_dir)
    if found:
        shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        raise UserError(
            f"{run_dir} holds an earlier run ({shown}); continue it with --resume, replace it with --overwrite, "
            "or train into another directory with --out DIR"
        )


def refuse_inputs_in_run(run_dir: Path, inputs: Iterable[str | Path | None]) -> None:
    """A run may not write over what it reads: refuse an input that is one of :data:`RUN_ENTRIES` or inside one."""
    refuse_inputs([run_dir / name for name in RUN_ENTRIES], inputs,
                  instead="train into another directory with --out DIR, or move the input out of the run directory",
                  flag="--overwrite")


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return 0
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def _human(n: float) -> str:
    return format_bytes(n)  # the one size style of every specformer message: 576 B, 36.9 KiB
