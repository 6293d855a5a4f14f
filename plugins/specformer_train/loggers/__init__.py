"""The ``logger`` component kind: where a run's metrics go, chosen with ``train.loggers``.

A logger is a component like an optimizer or a sampler. Its factory receives its own params
and, among the sizes of the kind, those it names: the run directory ``out_dir``, the step a
resumed run continues from ``resume_step`` (None for a fresh run), ``plot`` (``train.plot``:
draw pictures at the end) and ``tensorboard`` (``train.tensorboard``), and returns an object whose methods implement the training hooks
(:mod:`specformer_train.hookspecs`: ``specformer_on_train_step``, ``specformer_on_eval``,
...) marked with ``specformer.hookimpl`` -- or None when it cannot log in this
environment (TensorBoard without its package). The trainer registers each one with the
plugin manager for the length of the run, on the main process only, and at the end calls
its ``close(status)`` when it has one (``status``: finished, interrupted, diverged or
failed). The trainer names no logger; another plugin adds one from its
``specformer_register_components``::

    registry.register("logger", "wandb", factory="my_plugin.wandb:make_wandb_logger", params=WandbParams)

(by path, so that registering imports nothing heavy).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specformer.registry.discovery import get_plugin_manager
from specformer_train.loggers.params import JsonlParams, TensorBoardParams

KIND = "logger"
KIND_DOC = "Where a training run's metrics go (a file, TensorBoard, a tracking service): training-hook implementations."
SIZES = ("out_dir", "resume_step", "plot", "tensorboard")

#: What ``train.loggers`` is when a spec does not say: metrics.jsonl, and TensorBoard when installed.
DEFAULT_LOGGERS = ("jsonl", "tensorboard")


def register_loggers(registry: Any) -> None:
    """Register the built-in loggers by factory path (the kind itself is added by ``specformer_add_kinds``)."""
    registry.register(KIND, "jsonl", factory="specformer_train.loggers.jsonl:JsonlLogger", params=JsonlParams)
    registry.register(KIND, "tensorboard", factory="specformer_train.loggers.tensorboard:make_tensorboard_logger",
                      params=TensorBoardParams)


class RunLoggers:
    """The loggers of one run, registered as hook implementations until :meth:`close`."""

    def __init__(self, chosen: list[Any], *, out_dir: Path, resume_step: int | None, plot: bool,
                 tensorboard: bool) -> None:
        self._loggers: list[tuple[str, Any]] = []
        manager = get_plugin_manager()
        try:
            for resolved in chosen:
                logger = resolved.make(out_dir=Path(out_dir), resume_step=resume_step, plot=plot,
                                       tensorboard=tensorboard)
                if logger is None:
                    continue  # not available here (a missing optional package)
                name = f"logger-{resolved.component.name}-{id(logger)}"
                manager.register(logger, name=name)
                self._loggers.append((name, logger))
        except BaseException:
            self.close("failed")
            raise

    @property
    def loggers(self) -> list[Any]:
        return [logger for _, logger in self._loggers]

    def close(self, status: str) -> None:
        """Unregister every logger and close each (all of them, even when one fails; the first error is raised)."""
        manager, first_error = get_plugin_manager(), None
        for name, logger in reversed(self._loggers):
            manager.unregister(name=name)
            close = getattr(logger, "close", None)
            if close is None:
                continue
            try:
                close(status)
            except Exception as exc:  # noqa: BLE001 - closed the rest first, then re-raised
                first_error = first_error or exc
        self._loggers = []
        if first_error is not None:
            raise first_error
