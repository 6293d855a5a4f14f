"""Metrics of a run: one JSON object per line in ``<out_dir>/metrics.jsonl``, and a loss-curve PNG.

Training records are ``{"kind": "train", "step", "loss", "lr", "tokens_per_s", ...}``;
evaluation records ``{"kind": "eval", "step", "val_loss", "val_perplexity"}``. A resumed
run first drops the records past its checkpoint's step, so the file of an interrupted
and resumed run reads like that of an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from specformer.files.atomic import temp_sibling, write_text_atomic
from specformer_text import OutputError


METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"


class MetricsLog:
    """Appends records to ``metrics.jsonl`` (line-buffered, so a kill loses at most the last line)."""

    def __init__(self, out_dir: Path, *, resume_step: int | None) -> None:
        self.path = Path(out_dir) / METRICS_FILE
        kept = [] if resume_step is None else [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        try:
            write_text_atomic(self.path, "".join(json.dumps(r) + "\n" for r in kept))
            self._file = open(self.path, "a", encoding="utf-8", buffering=1)
        except OSError as exc:
            raise OutputError(f"could not write {self.path}: {exc.strerror or exc}") from None

    def write(self, kind: str, step: int, values: dict[str, Any]) -> None:
        record = {"kind": kind, "step": step, **{k: _jsonable(v) for k, v in values.items()}}
        try:
            self._file.write(json.dumps(record) + "\n")
        except OSError as exc:
            raise OutputError(f"could not write {self.path}: {exc.strerror or exc}") from None

    def close(self) -> None:
        try:
            self._file.close()
        except OSError:
            pass  # the write that failed has already been reported


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics file; a torn last line (a killed run) is skipped."""
    if not Path(path).is_file():
        return []
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def plot_losses(metrics_path: Path, png_path: Path, *, title: str = "") -> Path | None:
    """Training loss per step (and validation loss at each evaluation) as a PNG; None without matplotlib."""
    try:  # late: matplotlib is optional (no plot without it)
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return None
    records = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train" and _finite(r.get("loss"))]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("kind") == "eval" and _finite(r.get("val_loss"))]
    if not train and not val:
        return None
    figure = Figure(figsize=(7, 4), dpi=120)
    FigureCanvasAgg(figure)  # an off-screen canvas: no display, no global backend change
    axes = figure.add_subplot()
    if train:
        axes.plot(*zip(*train), label="train", linewidth=0.8, alpha=0.7)
    if val:
        axes.plot(*zip(*val), "o-", label="validation", markersize=3)
    axes.set_xlabel("step")
    axes.set_ylabel("loss (nats/token)")
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    tmp = temp_sibling(png_path)
    try:
        figure.savefig(tmp, format="png")
        os.replace(tmp, png_path)  # a failed write leaves the earlier plot whole
    except OSError as exc:
        raise OutputError(f"could not write {png_path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return png_path


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf; keep the record readable by any parser
    return value
