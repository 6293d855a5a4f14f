"""The hooks the train plugin declares: training events, for loggers and callbacks.

Added to the plugin manager when the plugin is registered (its
``specformer_add_hookspecs``). Implement one with ``specformer.hookimpl``; a logger such
as :mod:`specformer_train.loggers.tensorboard` is nothing more. Every hook runs on the
main process only.
"""

from __future__ import annotations

import pluggy

from specformer.hookspecs import PROJECT

hookspec = pluggy.HookspecMarker(PROJECT)


@hookspec
def specformer_on_train_start(out_dir: str) -> None:
    """Once, before the first step of a run (or of a resumed run): ``out_dir`` is the run directory."""


@hookspec
def specformer_on_train_step(step: int, metrics: "dict[str, float]") -> None:
    """After each optimizer step: ``metrics`` has at least ``loss``, ``lr``, ``tokens_per_s``."""


@hookspec
def specformer_on_eval(step: int, metrics: "dict[str, float]") -> None:
    """After each evaluation: ``metrics`` has at least ``val_loss`` and ``val_perplexity``."""


@hookspec
def specformer_on_checkpoint_saved(step: int, path: str) -> None:
    """After a checkpoint was written (atomically) to ``path``."""


@hookspec
def specformer_on_train_end(step: int, metrics: "dict[str, float]", out_dir: str) -> None:
    """Once, when training stops (finished, interrupted or stopped on a non-finite loss)."""


__all__ = ["specformer_on_checkpoint_saved", "specformer_on_eval", "specformer_on_train_end",
           "specformer_on_train_start", "specformer_on_train_step"]
