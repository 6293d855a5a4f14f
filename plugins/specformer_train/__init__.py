"""specformer's train plugin: data, tokenizers, the Trainer, checkpoints and ``specformer train``.

::

    from specformer_train import train
    result = train("specs/tiny.yaml", run_dir="runs/tiny", data="notes/")

The rows a training step reads are public too, for a plugin that brings its own data
(the fine-tuning plugin's chat rows): :class:`PackedRows`, :class:`EvalRows` and
:func:`split_tokens` over token ids in memory, :class:`StreamRows` over documents read as
needed, and :func:`data_record` / :func:`stream_record`, what a checkpoint records of its
data so that ``--resume`` continues on the same. Corpora and tokenizers themselves are
:mod:`specformer_text`'s.

Names are imported on first use, so loading the plugin (which every ``specformer``
command does) imports nothing heavy.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

_EXPORTS = {
    "TrainSpec": "specformer_train.config",
    "TrainConfig": "specformer_train.config",  # TrainSpec's earlier name
    "load_train_spec": "specformer_train.run",
    "train": "specformer_train.run",
    "TrainResult": "specformer_train.trainer",
    "Trainer": "specformer_train.trainer",
    "TrainingDiverged": "specformer_train.trainer",
    "EvalRows": "specformer_train.data",
    "PackedRows": "specformer_train.data",
    "split_tokens": "specformer_train.data",
    "StreamRows": "specformer_train.stream",
    "data_record": "specformer_train.datasource",
    "stream_record": "specformer_train.datasource",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
