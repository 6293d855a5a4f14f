"""DyT is found through the entry point, builds into a model, and computes its formula."""

from __future__ import annotations

import pytest
import specformer
import torch
from specformer_tutorial import DyT

TINY = {
    "model": {
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "context_length": 16,
        "positional": "rope",
        "block": {"norm": {"kind": "dyt", "alpha_init": 0.8}, "mixer": {"kind": "attention", "n_heads": 4}, "ffn": "swiglu"},
    }
}


def test_registered_by_this_plugin():
    component = specformer.get_registry().get("norm", "dyt")
    assert component.plugin == "tutorial"
    assert component.params is DyT.Params


@pytest.mark.parametrize("bias", [True, False])
def test_the_size_check_counts_what_is_built(bias):
    params = DyT.Params(bias=bias)
    built = DyT(params, dim=24)
    assert params.sized(dim=24).parameters == sum(p.numel() for p in built.parameters())


def test_formula():
    norm = DyT(DyT.Params(alpha_init=0.7), dim=8)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
        norm.bias.copy_(torch.linspace(-1.0, 1.0, 8))
    x = torch.randn(3, 5, 8)
    expected = torch.tanh(0.7 * x) * torch.linspace(0.5, 2.0, 8) + torch.linspace(-1.0, 1.0, 8)
    torch.testing.assert_close(norm(x), expected)


def test_model_with_dyt_everywhere_trains_a_step():
    model = specformer.build(TINY, seed=0)
    dyts = [m for m in model.modules() if isinstance(m, DyT)]
    assert len(dyts) == 2 * 2 + 1  # two per pre-norm block, and the final norm
    assert all(m.alpha.item() == pytest.approx(0.8) for m in dyts)
    ids = torch.randint(0, 64, (2, 16))
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert all(m.alpha.grad is not None and torch.isfinite(m.alpha.grad) for m in dyts)


def test_bad_params_are_spec_errors():
    bad = {"model": {**TINY["model"], "block": {**TINY["model"]["block"], "norm": {"kind": "dyt", "alpha_init": 0}}}}
    try:
        specformer.load_spec(bad)
    except specformer.SpecError as exc:
        assert "model.block.norm.alpha_init" in str(exc)
    else:
        raise AssertionError("alpha_init: 0 validated")
