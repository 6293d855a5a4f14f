"""``jsonl``: every training and evaluation record as one JSON line in ``<out_dir>/metrics.jsonl``.

The file format, the resume truncation and the loss plot live in :mod:`specformer_train.metrics`;
this logger writes the records as the training hooks report them and, when ``train.plot`` is
true, draws ``loss.png`` from the file when the run ends (whatever the ending).
"""

from __future__ import annotations

from pathlib import Path

from specformer.registry.hookspecs import hookimpl
from specformer_train.loggers.params import JsonlParams
from specformer_train.metrics import PLOT_FILE, MetricsLog, plot_losses


class JsonlLogger:
    """Metrics as JSON lines in metrics.jsonl, and loss.png when ``plot`` (see :class:`JsonlParams`)."""

    Params = JsonlParams

    def __init__(self, params: JsonlParams | None = None, *, out_dir: Path, resume_step: int | None,
                 plot: bool) -> None:
        self.out_dir = Path(out_dir)
        self.plot = plot
        self.log = MetricsLog(self.out_dir, resume_step=resume_step)

    @hookimpl
    def specformer_on_train_step(self, step: int, metrics: dict[str, float]) -> None:
        self.log.write("train", step, metrics)

    @hookimpl
    def specformer_on_eval(self, step: int, metrics: dict[str, float]) -> None:
        self.log.write("eval", step, metrics)

    def close(self, status: str) -> None:
        self.log.close()
        if self.plot:
            plot_losses(self.log.path, self.out_dir / PLOT_FILE, title=f"{self.out_dir.name} ({status})")
