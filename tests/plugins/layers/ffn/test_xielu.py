"""xIELU against its formula written out and against transformers' XIELUActivation; the MLP that names it."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from specformer_layers.ffn.mlp import MLP
from specformer_layers.ffn.params import MLPParams
from specformer_layers.ffn.xielu import XIELU
from specformer_layers.ffn.xielu_params import XIELUParams


def formula(x: float, raw_p: float, raw_n: float, beta: float, eps: float) -> float:
    """One value, scalar by scalar: a_p = log(1 + e^raw_p), a_n = beta + log(1 + e^raw_n);
    x > 0: a_p x^2 + beta x; else a_n (e^min(x, eps) - 1 - x) + beta x."""
    a_p = math.log1p(math.exp(raw_p))
    a_n = beta + math.log1p(math.exp(raw_n))
    if x > 0:
        return a_p * x * x + beta * x
    return a_n * (math.expm1(min(x, eps)) - x) + beta * x


def test_the_formula_value_by_value() -> None:
    act = XIELU(XIELUParams(beta=0.4, eps=-1e-5)).double()
    with torch.no_grad():
        act.alpha_p.fill_(0.3)
        act.alpha_n.fill_(-0.7)
    x = torch.cat([torch.linspace(-6, 6, 49, dtype=torch.float64), torch.tensor([0.0, -1e-7, 1e-7], dtype=torch.float64)])
    want = torch.tensor([formula(v, 0.3, -0.7, 0.4, -1e-5) for v in x.tolist()], dtype=torch.float64)
    torch.testing.assert_close(act(x), want)


def test_initial_alphas_are_the_ones_asked_for() -> None:
    act = XIELU(XIELUParams(alpha_p_init=1.3, alpha_n_init=0.9, beta=0.5))
    torch.testing.assert_close(torch.nn.functional.softplus(act.alpha_p), torch.tensor([1.3]))
    torch.testing.assert_close(0.5 + torch.nn.functional.softplus(act.alpha_n), torch.tensor([0.9]))
    # init_weights goes back to them after training moved them
    with torch.no_grad():
        act.alpha_p.fill_(5.0)
    act.init_weights(std=0.02, residual_std=0.02)
    torch.testing.assert_close(torch.nn.functional.softplus(act.alpha_p), torch.tensor([1.3]))


def test_matches_transformers() -> None:
    from transformers.activations import XIELUActivation

    theirs = XIELUActivation(dtype=torch.float32)
    ours = XIELU()
    torch.testing.assert_close(ours.alpha_p.data, theirs.alpha_p.data)  # the same initial raw values
    torch.testing.assert_close(ours.alpha_n.data, theirs.alpha_n.data)
    with torch.no_grad():  # trained values, as a checkpoint carries them
        for mine, other, value in ((ours.alpha_p, theirs.alpha_p, 0.6), (ours.alpha_n, theirs.alpha_n, -0.2)):
            mine.fill_(value)
            other.fill_(value)
    x = torch.randn(3, 5, 40) * 3
    torch.testing.assert_close(ours(x), theirs._xielu_python(x))


def test_gradients_reach_both_alphas() -> None:
    act = XIELU()
    act(torch.linspace(-3, 3, 11)).sum().backward()
    assert act.alpha_p.grad is not None and act.alpha_p.grad.abs().item() > 0
    assert act.alpha_n.grad is not None and act.alpha_n.grad.abs().item() > 0


def test_an_mlp_names_it_and_counts_its_parameters() -> None:
    params = MLPParams(hidden=12, activation={"kind": "xielu", "beta": 0.4}, bias=False)
    mlp = MLP(params, d_model=6).double()
    assert isinstance(mlp.activation, XIELU) and mlp.activation.beta == 0.4
    assert params.sized(d_model=6).parameters == sum(p.numel() for p in mlp.parameters()) == 2 * 6 * 12 + 2
    x = torch.randn(2, 3, 6, dtype=torch.float64)
    torch.testing.assert_close(mlp(x), mlp.fc_out(mlp.activation(mlp.fc_in(x))))
    assert set(mlp.parallel_plan()) >= {"activation.alpha_p", "activation.alpha_n"}
    assert MLPParams(activation="silu").activation == "silu"  # a fixed one is still named as before


def test_alpha_n_at_or_below_beta_is_refused() -> None:
    with pytest.raises(ValidationError, match="alpha_n_init .* must exceed beta"):
        XIELUParams(alpha_n_init=0.5, beta=0.5)
