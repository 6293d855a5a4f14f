"""``tensorboard``: scalars of every step and evaluation as TensorBoard event files.

Event files go to ``<out_dir>/tensorboard`` (``tensorboard --logdir runs/``). Without the
``tensorboard`` package (the ``tensorboard`` extra) the logger is skipped, so it can be on
by default; ``train.tensorboard: false`` turns it off too. A W&B or MLflow logger is the
same few lines around its own client.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specformer.registry.hookspecs import hookimpl
from specformer.registry.params import Params


class TensorBoardLogger:
    """Scalars of every training step and evaluation, under train/ and eval/, in <out_dir>/tensorboard."""

    class Params(Params):
        pass

    def __init__(self, log_dir: Path, *, purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events past a resumed checkpoint, as metrics.jsonl does.
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)

    @classmethod
    def from_params(cls, params: Params, *, out_dir: Path, resume_step: int | None,
                    train: Any) -> "TensorBoardLogger | None":
        if not train.tensorboard or not tensorboard_available():
            return None
        return cls(Path(out_dir) / "tensorboard", purge_step=None if resume_step is None else resume_step + 1)

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


def tensorboard_available() -> bool:
    try:
        import tensorboard  # noqa: F401
        from torch.utils.tensorboard import SummaryWriter  # noqa: F401
    except ImportError:
        return False
    return True
