"""The optimizer: AdamW's parameter groups (weight decay on matrices only), make_optimizer's refusals and
group_settings, against messages and values written out here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import specformer
from specformer.errors import UserError
from specformer_train.config import TrainSpec
from specformer_train.optim import group_settings, make_optimizer, param_groups

from .conftest import tiny_train_spec


def test_matrices_decay_vectors_do_not() -> None:
    model = specformer.build(tiny_train_spec(), seed=0)
    decay, no_decay = param_groups(model, weight_decay=0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {names[id(p)] for p in decay["params"]} == {n for n, p in model.named_parameters() if p.dim() >= 2}
    assert all(names[id(p)].endswith("weight") and "norm" in names[id(p)] for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_decoupled_decay_shrinks_matrices_only_by_lr_times_wd() -> None:
    model = specformer.build(tiny_train_spec(), seed=0)
    config = TrainSpec(lr=0.1, weight_decay=0.5)
    optimizer = make_optimizer(model, config, device=torch.device("cpu"))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)  # no gradient: AdamW's only change is the decay
    optimizer.step()
    for name, p in model.named_parameters():
        factor = 1 - 0.1 * 0.5 if p.dim() >= 2 else 1.0
        torch.testing.assert_close(p.detach(), before[name] * factor)
    assert optimizer.defaults["betas"] == (0.9, 0.95)


CPU = torch.device("cpu")


def test_an_impossible_optimizer_setting_is_a_user_error_with_the_components_message() -> None:
    model = specformer.build(tiny_train_spec(), seed=0)
    config = TrainSpec(optimizer={"kind": "sgd", "nesterov": True, "momentum": 0})
    with pytest.raises(UserError) as caught:
        make_optimizer(model, config, device=CPU)
    assert str(caught.value) == "train.optimizer: nesterov: true needs momentum > 0"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__


def plugin_optimizer(groups: list[dict]) -> SimpleNamespace:
    """A stand-in for a plugin's optimizer component whose groups are given."""

    def make(**sizes):
        return torch.optim.SGD(groups, lr=0.1)

    return SimpleNamespace(make=make, component=SimpleNamespace(name="my_sgd"))


@pytest.mark.parametrize("keys", [{}, {"peak_lr": 0.1}, {"min_lr": 0.0}])
def test_groups_without_peak_lr_or_min_lr_are_refused_by_name(keys: dict) -> None:
    model = specformer.build(tiny_train_spec(), seed=0)
    config = TrainSpec().model_copy(update={"optimizer": plugin_optimizer([{"params": list(model.parameters()), **keys}])})
    with pytest.raises(UserError) as caught:
        make_optimizer(model, config, device=CPU)
    assert str(caught.value) == ("optimizer 'my_sgd' built param groups without peak_lr and min_lr; "
                                 "build them with specformer_train.optimizers.groups.build_groups")


def test_groups_with_both_are_accepted() -> None:
    model = specformer.build(tiny_train_spec(), seed=0)
    groups = [{"params": list(model.parameters()), "peak_lr": 0.1, "min_lr": 0.0}]
    config = TrainSpec().model_copy(update={"optimizer": plugin_optimizer(groups)})
    optimizer = make_optimizer(model, config, device=CPU)
    assert isinstance(optimizer, torch.optim.SGD)


def test_group_settings_are_every_setting_but_the_parameters() -> None:
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))
    optimizer = torch.optim.SGD([{"params": [a], "lr": 0.5, "peak_lr": 0.5}, {"params": [b], "weight_decay": 0.1}],
                                lr=0.25)
    settings = group_settings(optimizer)
    assert [s["lr"] for s in settings] == [0.5, 0.25]
    assert settings[0]["peak_lr"] == 0.5 and settings[1]["weight_decay"] == 0.1
    assert all("params" not in s for s in settings)
    assert set(settings[1]) == set(optimizer.param_groups[1]) - {"params"}
