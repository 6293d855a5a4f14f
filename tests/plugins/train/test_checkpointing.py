"""Checkpoint files: exact round trip of model, optimizer and RNG; atomic directory protocol; clear errors."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

import specformer
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_train.checkpointing import (TrainerState, latest_checkpoint, load_checkpoint, save_checkpoint,
                                            step_dirs)
from specformer_train.config import TrainConfig
from specformer_train.distributed import DistContext
from specformer_train.optim import make_optimizer

from .conftest import tiny_spec


def trained(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = specformer.build(tiny_spec(), seed=seed)
    optimizer = make_optimizer(model, TrainConfig(), device=torch.device("cpu"))
    for _ in range(2):
        model(torch.randint(0, 259, (2, 8))).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def test_round_trip_restores_weights_optimizer_and_rng_exactly(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    state = TrainerState(step=7, sequences=28, tokens=896, elapsed_s=1.5)
    torch.manual_seed(123)
    random.seed(4)
    np.random.seed(5)
    path = save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer, state=state,
                           tokenizer=ByteTokenizer(), ctx=DistContext(), keep_last=3)
    expected_draws = (torch.rand(3), random.random(), np.random.rand())

    other, other_optimizer = trained(1)
    torch.manual_seed(999)
    loaded = load_checkpoint(path, model=other, optimizer=other_optimizer, tokenizer=ByteTokenizer(), ctx=DistContext())
    assert (loaded.step, loaded.sequences, loaded.tokens) == (7, 28, 896)
    for (name, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), other.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][key], other_optimizer.state[q][key]), key
    draws = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1:] == expected_draws[1:]


def test_latest_names_the_newest_complete_directory_and_leftovers_are_ignored(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    for step in (2, 4):
        save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer, state=TrainerState(step=step),
                        tokenizer=ByteTokenizer(), ctx=DistContext(), keep_last=5)
    (tmp_path / "checkpoints" / ".step-0000006.tmp").mkdir()  # what a kill during a save leaves
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-0000004"
    assert [step for step, _ in step_dirs(tmp_path)] == [2, 4]
    assert latest_checkpoint(tmp_path / "elsewhere") is None


def test_a_checkpoint_of_another_model_is_refused_clearly(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    path = save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer, state=TrainerState(step=1),
                           tokenizer=ByteTokenizer(), ctx=DistContext(), keep_last=1)
    spec = tiny_spec()
    spec["model"]["d_model"] = 48
    bigger = specformer.build(spec, seed=0)
    with pytest.raises(specformer.CheckpointError, match=r"does not fit the model of this spec .*mis-shaped"):
        load_checkpoint(path, model=bigger, optimizer=make_optimizer(bigger, TrainConfig(), device=torch.device("cpu")),
                        tokenizer=ByteTokenizer(), ctx=DistContext())
    (path / "optimizer.safetensors").unlink()
    with pytest.raises(specformer.CheckpointError, match=r"not a complete training checkpoint \(no optimizer.safetensors\)"):
        load_checkpoint(path, model=model, optimizer=optimizer, tokenizer=ByteTokenizer(), ctx=DistContext())


@pytest.mark.parametrize("field, value", [("step", -1), ("step", True), ("sequences", "12"), ("elapsed_s", "x"),
                                          ("last_val_loss", "low"), ("threads", 2.5), ("data", [1]), ("extra", 3)])
def test_a_trainer_state_with_a_wrong_type_is_a_damaged_checkpoint(tmp_path: Path, field: str, value: object) -> None:
    import json

    from specformer_train.checkpointing import DamagedCheckpoint, read_checkpoint

    model, optimizer = trained(0)
    path = save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer, state=TrainerState(step=1),
                           tokenizer=ByteTokenizer(), ctx=DistContext(), keep_last=1)
    read_checkpoint(path)  # intact as written
    data = json.loads((path / "trainer.json").read_text())
    (path / "trainer.json").write_text(json.dumps({**data, field: value}))
    with pytest.raises(DamagedCheckpoint, match=r"trainer.json: .*(must be non-negative integers|wrong type)"):
        read_checkpoint(path)
