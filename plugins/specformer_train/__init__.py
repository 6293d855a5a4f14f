"""specformer's train plugin: data, tokenizers, the Trainer, checkpoints and ``specformer train``."""

from __future__ import annotations

from specformer_train.config import TrainConfig
from specformer_train.run import load_train_spec, train
from specformer_train.trainer import Trainer, TrainingDiverged, TrainResult

__all__ = ["TrainConfig", "TrainResult", "Trainer", "TrainingDiverged", "load_train_spec", "train"]
