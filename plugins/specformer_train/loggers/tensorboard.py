"""``tensorboard``: scalars of every step and evaluation as TensorBoard event files.

Event files go to ``<out_dir>/tensorboard`` (``tensorboard --logdir runs/``). Without the
``tensorboard`` package (the ``tensorboard`` extra) the logger is skipped, so it can be on
by default; ``train.tensorboard: false`` turns it off too. A W&B or MLflow logger is the
same few lines around its own client.
"""

from __future__ import annotations

from pathlib import Path

from specformer.registry.hookspecs import hookimpl
from specformer_train.loggers.params import TensorBoardParams


class TensorBoardLogger:
    """Scalars of every training step and evaluation as event files in ``log_dir`` (see :class:`TensorBoardParams`)."""

    Params = TensorBoardParams

    def __init__(self, log_dir: Path, *, purge_step: int | None = None) -> None:
        # late: tensorboard is optional (the train extra); the factory returns None without it
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

    def close(self, status: str) -> None:
        self.writer.close()


def make_tensorboard_logger(params: TensorBoardParams, *, out_dir: Path, resume_step: int | None,
                            tensorboard: bool) -> TensorBoardLogger | None:
    """The logger in ``<out_dir>/tensorboard``; None when ``train.tensorboard`` is false or the package is missing."""
    if not tensorboard or not tensorboard_available():
        return None
    return TensorBoardLogger(Path(out_dir) / "tensorboard", purge_step=None if resume_step is None else resume_step + 1)


def tensorboard_available() -> bool:
    try:  # late: tensorboard is optional (the logger says how to install it)
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        return False
    return True
