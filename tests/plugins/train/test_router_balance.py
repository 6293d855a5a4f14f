"""Auxiliary-loss-free balancing: the bias update by formula, and the trainer applying it every step."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

import specformer
from specformer_train import train
from specformer_train.router_balance import BiasBalanced, balance_routers

from .conftest import TINY_MODEL, TINY_TRAIN


class ThirdPartyRouter(nn.Module):
    """Not a built-in router: only the three attributes the train plugin reads."""

    def __init__(self, n_experts: int, rate: float) -> None:
        super().__init__()
        self.register_buffer("selection_bias", torch.zeros(n_experts))
        self.bias_update_rate = rate
        self.observed_load: torch.Tensor | None = None


def test_update_follows_the_formula() -> None:
    model = nn.ModuleDict({"a": ThirdPartyRouter(4, 0.01), "b": ThirdPartyRouter(4, 0.5), "c": ThirdPartyRouter(4, 0.1)})
    model["a"].selection_bias.copy_(torch.tensor([0.2, -0.1, 0.0, 0.05]))
    model["a"].observed_load = torch.tensor([10.0, 2.0, 6.0, 6.0])  # mean 6: over, under, at, at
    model["b"].observed_load = torch.tensor([0.0, 0.0, 0.0, 12.0])  # mean 3
    assert isinstance(model["a"], BiasBalanced)
    assert balance_routers(model) == 2  # c observed nothing: untouched
    # bias_e += rate * sign(mean - load_e)
    torch.testing.assert_close(model["a"].selection_bias, torch.tensor([0.2 - 0.01, -0.1 + 0.01, 0.0, 0.05]))
    torch.testing.assert_close(model["b"].selection_bias, torch.tensor([0.5, 0.5, 0.5, -0.5]))
    assert model["c"].selection_bias.abs().sum() == 0
    assert model["a"].observed_load is None and model["b"].observed_load is None  # counting starts over
    assert balance_routers(model) == 0


def test_balancing_evens_out_a_skewed_router() -> None:
    """Repeated updates on the same tokens move load from the favoured experts to the others."""
    from specformer_layers.routers.sigmoid_topk import SigmoidTopK

    torch.manual_seed(0)
    router = SigmoidTopK(SigmoidTopK.Params(bias_update_rate=0.05), d_model=8, n_experts=4, top_k=1).train()
    with torch.no_grad():
        router.weight.normal_(0, 0.1)
        router.weight[0, 0] = 3.0  # expert 0 wins for (nearly) every token: their first channel is positive
    tokens = torch.randn(400, 8).abs()

    def spread() -> float:
        return torch.bincount(router(tokens).experts.flatten(), minlength=4).float().std().item()

    before = spread()
    router.observed_load = None
    for _ in range(60):
        router(tokens)
        balance_routers(router)
    assert spread() < before / 4


def _moe_spec(corpus: Path, out: Path, rate: float) -> dict:
    model = copy.deepcopy(TINY_MODEL)
    model["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "aux_loss_coef": 0.0,
                             "router": {"kind": "sigmoid_topk", "bias_update_rate": rate}}
    settings = {**TINY_TRAIN, "steps": 3, "grad_accum": 2, "batch_size": 2, "eval_every": 0, "save_every": 0,
                "data": str(corpus), "out_dir": str(out)}
    return {"model": model, "train": settings}


@pytest.mark.parametrize("rate", [0.0, 0.25])
def test_the_trainer_updates_the_bias_every_step(tmp_path: Path, corpus_dir: Path, rate: float) -> None:
    result = train(_moe_spec(corpus_dir, tmp_path / "run", rate))
    model = specformer.load(result.model_path)
    biases = torch.stack([block.ffn.router.selection_bias for block in model.blocks])  # (layers, experts)
    if rate == 0:
        assert biases.abs().sum() == 0
        return
    # Three steps of +-rate (or 0) per expert: a multiple of the rate, at most 3 rates, and not all zero.
    steps = biases / rate
    torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-6)
    assert steps.abs().max() <= 3 and steps.abs().sum() > 0
    assert biases.dtype == torch.float32
