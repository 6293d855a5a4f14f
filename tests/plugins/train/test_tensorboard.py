"""The TensorBoard logger plugin writes scalars when its package is installed."""

from __future__ import annotations

from pathlib import Path

import pytest

from specformer.registry.discovery import get_plugin_manager
from specformer_train import train

from .conftest import tiny_train_spec


def test_scalars_reach_tensorboard_event_files(tmp_path: Path, corpus_dir: Path) -> None:
    pytest.importorskip("tensorboard", reason="the tensorboard package is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    plugins_before = {name for name, _ in get_plugin_manager().list_name_plugin()}
    train(tiny_train_spec(data=str(corpus_dir), out_dir=str(tmp_path / "run"), tensorboard=True, steps=4, eval_every=2))
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"train/loss", "train/lr", "eval/val_loss"} <= set(scalars)
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.step for e in events.Scalars("eval/val_loss")] == [2, 4]
    assert {name for name, _ in get_plugin_manager().list_name_plugin()} == plugins_before, "unregistered at the end"
