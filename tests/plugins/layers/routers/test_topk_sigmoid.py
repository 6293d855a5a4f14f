"""Llama 4's routing (topk_sigmoid): the formula token by token, the moe scaling each expert's input by the
weight, and the whole moe (routed plus shared expert) against transformers' Llama4TextMoe."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import specformer
from specformer_layers.ffn.moe import MoE
from specformer_layers.ffn.params import MoEParams
from specformer_layers.routers.params import TopKSigmoidParams
from specformer_layers.routers.topk_sigmoid import TopKSigmoid

from ..support import tiny_spec_over_vocab

D, E, HIDDEN = 12, 6, 10


def reference(weight: list[list[float]], token: list[float], top_k: int) -> dict[int, float]:
    """``{expert: sigmoid(logit)}`` for the ``top_k`` largest logits ``w_e . x`` (no renormalisation)."""
    logits = [sum(w * x for w, x in zip(row, token)) for row in weight]
    chosen = sorted(range(len(logits)), key=lambda e: -logits[e])[:top_k]
    return {e: 1 / (1 + math.exp(-logits[e])) for e in chosen}


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_router_is_the_formula(top_k: int) -> None:
    router = TopKSigmoid(TopKSigmoidParams(), d_model=D, n_experts=E, top_k=top_k).double()
    torch.nn.init.normal_(router.weight, generator=torch.Generator().manual_seed(0))
    tokens = torch.randn(30, D, dtype=torch.float64)
    weights, experts, probs = router(tokens)
    for n, token in enumerate(tokens.tolist()):
        want = reference(router.weight.tolist(), token, top_k)
        got = dict(zip(experts[n].tolist(), weights[n].tolist()))
        assert got.keys() == want.keys()
        assert [got[e] for e in want] == pytest.approx([want[e] for e in want], rel=1e-12)
    torch.testing.assert_close(probs, (tokens @ router.weight.T).softmax(-1))
    assert router.weights_on == "input"


def _moe(weights_on: str, *, grad: bool) -> tuple[MoE, torch.Tensor]:
    torch.manual_seed(0)
    params = MoEParams(n_experts=E, top_k=2, hidden=HIDDEN, router={"kind": "topk_sigmoid", "weights_on": weights_on})
    moe = MoE(params, d_model=D).double()
    for p in moe.parameters():
        torch.nn.init.normal_(p, std=0.5)
    return moe, torch.randn(7, D, dtype=torch.float64, requires_grad=grad)


def expert(moe: MoE, e: int, x: torch.Tensor) -> torch.Tensor:
    """SwiGLU expert ``e`` written out: ``down(silu(gate x) * up x)``."""
    gate, up = moe.experts_in[e].chunk(2, dim=0)
    return moe.experts_out[e] @ (F.silu(gate @ x) * (up @ x))


@pytest.mark.parametrize("grad", [False, True])  # both of the moe's expert loops
@pytest.mark.parametrize("weights_on", ["input", "output"])
def test_the_weight_scales_the_expert_input_or_output(weights_on: str, grad: bool) -> None:
    moe, x = _moe(weights_on, grad=grad)
    with torch.set_grad_enabled(grad):
        got = moe(x)
    weights, experts, _ = moe.router(x.detach())
    for n in range(len(x)):
        want = torch.zeros(D, dtype=torch.float64)
        for w, e in zip(weights[n], experts[n].tolist()):
            token = x[n].detach()
            want += expert(moe, e, w * token) if weights_on == "input" else w * expert(moe, e, token)
        torch.testing.assert_close(got[n].detach(), want.detach(), rtol=1e-12, atol=1e-12)


def test_input_and_output_scaling_differ() -> None:
    """The experts are not linear: the two places give different results (the test above bites)."""
    (a, x), (b, _) = _moe("input", grad=False), _moe("output", grad=False)
    assert not torch.allclose(a(x), b(x))


def test_moe_with_shared_expert_matches_transformers_llama4() -> None:
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    config = Llama4TextConfig(hidden_size=D, intermediate_size=HIDDEN, num_local_experts=E, num_experts_per_tok=1)
    torch.manual_seed(2)
    theirs = Llama4TextMoe(config).double()
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.4)
    spec = tiny_spec_over_vocab(d_model=D)
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 2}
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": E, "top_k": 1, "hidden": HIDDEN, "n_shared_experts": 1,
                                     "router": {"kind": "topk_sigmoid"}}
    ours = specformer.build(spec).blocks[0].ffn.double()
    with torch.no_grad():
        ours.router.weight.copy_(theirs.router.weight)
        ours.experts_in.copy_(theirs.experts.gate_up_proj.transpose(1, 2))  # (E, D, 2H) -> (E, 2H, D), [gate; up]
        ours.experts_out.copy_(theirs.experts.down_proj.transpose(1, 2))  # (E, H, D) -> (E, D, H)
        shared = theirs.shared_expert
        ours.shared.gate_up.weight.copy_(torch.cat([shared.gate_proj.weight, shared.up_proj.weight]))
        ours.shared.down.weight.copy_(shared.down_proj.weight)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    want, _ = theirs(x)
    # transformers takes the sigmoid in float32 whatever the dtype: float32 closeness in float64
    torch.testing.assert_close(ours(x), want.view(2, 5, D), rtol=1e-5, atol=1e-6)
