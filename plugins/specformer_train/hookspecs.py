"""The hooks the train plugin declares: training events, for loggers and callbacks.

Added to the plugin manager when the plugin is registered (its
``specformer_add_hookspecs``). Implement one with ``specformer.hookimpl``; a logger such
as :mod:`specformer_train.loggers.tensorboard` is nothing more. Every hook runs on the
main process only.
"""

from __future__ import annotations

from typing import Any

import pluggy

from specformer.registry.hookspecs import PROJECT

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


@hookspec
def specformer_train_prepare_model(model: "Any", config: "Any", init: "str | None") -> None:
    """Once the model is built (and loaded from ``init``, the ``train.init`` checkpoint, when given), before the
    optimizer is made: change it in place (the fine-tuning plugin applies ``train.adapter`` here). Every process."""


@hookspec(firstresult=True)
def specformer_train_saved_weights(model: "Any", weights: "dict[str, Any]", path: str) -> "Any":
    """Which weights a checkpoint's ``model.safetensors`` (at ``path``) stores: ``(weights, header_entries)`` to
    store a part of them with header entries of the plugin's own (an adapter's tensors and its base), else None."""


@hookspec(firstresult=True)
def specformer_train_resumed_weights(model: "Any", weights: "dict[str, Any]") -> "Any":
    """On resume, the full state dict to load into ``model`` from a checkpoint's stored ``weights`` (which a
    ``specformer_train_saved_weights`` implementation made partial), else None."""


@hookspec(firstresult=True)
def specformer_train_rows(config: "Any", tokenizer: "Any", seq_len: int, metadata: "dict[str, str] | None",
                          vocab_size: int) -> "Any":
    """Training rows a plugin reads from ``config.data`` itself (chat data with a loss mask), else None.

    ``tokenizer`` and ``metadata`` are the ``train.init`` checkpoint's (None without one).
    Return an object with ``tokenizer``, ``train_rows`` (a :class:`~specformer_train.data.PackedRows`,
    or with ``config.streaming`` a :class:`~specformer_train.stream.StreamRows`, optionally
    with ``loss_mask(first, count)``), ``val_rows`` (an ``EvalRows`` or None, optionally with
    ``loss_mask(indices)``), ``description``, ``n_tokens``, ``n_train`` (both None when
    streamed), ``n_val`` and ``record`` (the data record,
    :func:`specformer_train.datasource.data_record`, or ``stream_record`` when streamed).
    A loss mask is a bool array aligned with the rows; targets where it is False do not count.
    """


__all__ = ["specformer_train_prepare_model", "specformer_train_rows", "specformer_train_resumed_weights", "specformer_train_saved_weights",
           "specformer_on_checkpoint_saved", "specformer_on_eval", "specformer_on_train_end",
           "specformer_on_train_start", "specformer_on_train_step"]
