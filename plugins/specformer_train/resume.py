"""``--resume``: which checkpoint to continue from, falling back past damaged ones.

``--resume`` (or ``--resume latest``) starts with the checkpoint ``checkpoints/latest``
names. When that directory is missing or one of its files is damaged (truncated,
garbage, a hand edit gone wrong, a sharded checkpoint's shard missing), the run says which file is bad and falls back to the
newest older checkpoint that reads back whole; checkpoints newer than ``latest`` belong
to a timeline that a previous resume abandoned and are not considered. A checkpoint
named explicitly (``--resume runs/x/checkpoints/step-0000400``) is used as it is or
refused, never swapped for another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from specformer.checkpoint.locate import resume_candidates
from specformer.errors import UserError

from specformer_train.checkpointing import (LATEST, CheckpointContents, DamagedCheckpoint, checkpoint_root,
                                            read_checkpoint)


def find_resumable(out_dir: Path, requested: bool | str | Path, *, rank: int = 0, world_size: int = 1,
                   say: Callable[[str], None] = print) -> CheckpointContents:
    """The checkpoint ``--resume`` continues from, read and checked (see the module doc)."""
    if requested is not True and requested != LATEST:
        path = Path(requested)
        if not (path / "trainer.json").is_file():
            raise UserError(f"--resume {str(path)!r}: not a checkpoint directory (no trainer.json); "
                            f"give a {out_dir}/checkpoints/step-N directory or no value for the latest")
        try:
            return read_checkpoint(path, rank=rank, world_size=world_size)
        except DamagedCheckpoint as exc:
            raise UserError(f"--resume: the checkpoint is damaged: {exc}; give another step-N directory, "
                            "or --resume without a value to use the newest intact one") from None

    candidates = resume_candidates(out_dir)
    if not candidates:
        raise UserError(f"--resume: {out_dir} has no checkpoint to resume from (looked for "
                        f"{checkpoint_root(out_dir) / LATEST}); train without --resume first")
    problems = []
    for index, path in enumerate(candidates):
        try:
            contents = read_checkpoint(path, rank=rank, world_size=world_size)
        except DamagedCheckpoint as exc:
            problems.append(str(exc))
            say(f"warning: cannot resume from {path.name}: {exc}")
            continue
        if index > 0:
            say(f"note: resuming from {path.name}, the newest intact checkpoint")
        return contents
    raise UserError(f"--resume: no intact checkpoint in {checkpoint_root(out_dir)} ("
                    + "; ".join(problems) + "); start afresh with --overwrite")
