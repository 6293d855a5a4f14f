"""AdamW parameter groups: weight decay on matrices only."""

from __future__ import annotations

import torch

import specformer
from specformer_train.config import TrainConfig
from specformer_train.optim import make_optimizer, param_groups

from .conftest import tiny_spec


def test_matrices_decay_vectors_do_not() -> None:
    model = specformer.build(tiny_spec(), seed=0)
    decay, no_decay = param_groups(model, weight_decay=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {names[id(p)] for p in decay["params"]} == {n for n, p in model.named_parameters() if p.dim() >= 2}
    assert all(names[id(p)].endswith("weight") and "norm" in names[id(p)] for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_decoupled_decay_shrinks_matrices_only_by_lr_times_wd() -> None:
    model = specformer.build(tiny_spec(), seed=0)
    config = TrainConfig(lr=0.1, weight_decay=0.5)
    optimizer = make_optimizer(model, config, device=torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: AdamW's only change is the decay
    optimizer.step()
    for name, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[name] * factor)
    assert optimizer.defaults["betas"] == (0.9, 0.95)
