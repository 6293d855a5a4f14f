"""A TensorBoard logger, written as a plugin: it only implements the training hooks.

The trainer registers one for the length of a run when ``train.tensorboard`` is true
and ``torch.utils.tensorboard`` (the ``tensorboard`` package) imports; event files go
to ``<out_dir>/tensorboard`` (``tensorboard --logdir runs/``). A W&B or MLflow logger
is the same few lines around its own client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specformer.hookspecs import hookimpl


class TensorBoardLogger:
    """Scalars of every training step and evaluation, under ``train/`` and ``eval/``."""

    def __init__(self, log_dir: Path, *, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events past a resumed checkpoint, as metrics.jsonl does.
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    @hookimpl
    def specformer_on_train_step(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"train/{name}", value, step)

    @hookimpl
    def specformer_on_eval(self, step: int, metrics: dict[str, float]) -> None:
        for name, value in metrics.items():
            if isinstance(value, (int, float)):
                self.writer.add_scalar(f"eval/{name}", value, step)

    @hookimpl
    def specformer_on_train_end(self, step: int, metrics: dict[str, float], out_dir: str) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        return False
    return True


def make_logger(out_dir: Path, *, resume_step: int | None) -> Any:
    """A logger writing to ``<out_dir>/tensorboard``, or None when TensorBoard is not installed."""
    if not tensorboard_available():
        return None
    return TensorBoardLogger(Path(out_dir) / "tensorboard", purge_step=None if resume_step is None else resume_step + 1)
