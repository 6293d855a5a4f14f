"""PhiMoE's SparseMixer top-2 router (sparsemixer): the rule written out token by token, ties of the mask at its edge,
its refusals, and the whole moe against transformers' PhimoeSparseMoeBlock."""

from __future__ import annotations

import math

import pytest
import torch

from specformer_layers.ffn.moe import MoE
from specformer_layers.ffn.params import MoEParams
from specformer_layers.routers.params import SparseMixerParams
from specformer_layers.routers.sparsemixer import SparseMixer

D, E = 12, 7


def reference(logits: list[float], eps: float) -> list[tuple[int, float]]:
    """[(expert, weight)] for the first and second choice, as PhiMoE's sparsemixer computes them at inference."""
    chosen: list[tuple[int, float]] = []
    left = list(range(len(logits)))
    for _ in range(2):
        best = max(left, key=lambda j: (logits[j], -j))  # the first index of the largest logit
        top = logits[best]
        # j shares the softmax when its relative distance (top - s_j) / max(|s_j|, top) is at most 2 * eps
        near = [j for j in left if (top - logits[j]) / max(abs(logits[j]), top) <= 2 * eps]
        total = sum(math.exp(logits[j]) for j in near)
        chosen.append((best, math.exp(top) / total))
        left.remove(best)
    return chosen


@pytest.mark.parametrize("eps", [0.0, 0.01, 0.3, 2.0])
def test_router_is_the_formula(eps: float) -> None:
    router = SparseMixer(SparseMixerParams(jitter_eps=eps), d_model=D, n_experts=E, top_k=2).double()
    torch.nn.init.normal_(router.weight, std=0.4, generator=torch.Generator().manual_seed(0))
    tokens = torch.randn(40, D, dtype=torch.float64)
    weights, experts, probs = router(tokens)
    logits = tokens @ router.weight.T
    shared = 0
    for n in range(len(tokens)):
        want = reference(logits[n].tolist(), eps)
        assert experts[n].tolist() == [e for e, _ in want]
        assert weights[n].tolist() == pytest.approx([w for _, w in want], rel=1e-12)
        shared += sum(w < 1 - 1e-12 for _, w in want)
    torch.testing.assert_close(probs, logits.softmax(-1))
    if eps >= 0.3:  # the mask must have let rivals into some softmaxes, or this tests only argmax
        assert shared > 10
    if eps == 0.0:  # only exact ties share: every weight is one
        assert torch.equal(weights, torch.ones_like(weights))


def test_negative_best_logit_measures_distance_relative_to_the_rival() -> None:
    """With every logit negative, max(|s_j|, s_best) is |s_j|: the distance is relative to the rival's size."""
    router = SparseMixer(SparseMixerParams(jitter_eps=0.1), d_model=3, n_experts=3, top_k=2).double()
    router.weight.data = torch.eye(3, dtype=torch.float64)
    # First choice, expert 0: expert 1 is (-1 + 1.1) / 1.1 = 0.09 <= 0.2 away and shares; expert 2, 2 / 3 > 0.2, not.
    # Second choice, expert 1 (expert 0 taken out): expert 2 is 1.9 / 3 = 0.63 > 0.2 away, so expert 1 weighs 1.
    logits = [-1.0, -1.1, -3.0]
    weights, experts, _ = router(torch.tensor([logits], dtype=torch.float64))
    assert experts[0].tolist() == [0, 1]
    assert weights[0].tolist() == pytest.approx([math.exp(-1.0) / (math.exp(-1.0) + math.exp(-1.1)), 1.0], rel=1e-12)


def test_only_top_2() -> None:
    with pytest.raises(ValueError, match="exactly 2 experts \\(top_k 2\\), got top_k 3"):
        SparseMixer(SparseMixerParams(), d_model=D, n_experts=E, top_k=3)
    with pytest.raises(ValueError, match="exactly 2 experts"):
        MoEParams(n_experts=4, top_k=1, router="sparsemixer").sized(d_model=8)


def test_gradients_reach_the_router_weight() -> None:
    router = SparseMixer(SparseMixerParams(jitter_eps=0.5), d_model=D, n_experts=E, top_k=2)
    weights, _, _ = router(torch.randn(9, D))
    weights.sum().backward()
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("jitter", [0.01, 0.4])
def test_moe_matches_transformers_phimoe_block(jitter: float) -> None:
    from transformers import PhimoeConfig
    from transformers.models.phimoe.modeling_phimoe import PhimoeSparseMoeBlock

    config = PhimoeConfig(hidden_size=16, intermediate_size=20, num_local_experts=6, num_experts_per_tok=2,
                          num_attention_heads=2, num_key_value_heads=2, router_jitter_noise=jitter)
    theirs = PhimoeSparseMoeBlock(config).eval()
    for p in theirs.parameters():
        p.data.normal_(0, 0.3)
    ours = MoE(MoEParams(n_experts=6, top_k=2, hidden=20, router={"kind": "sparsemixer", "jitter_eps": jitter}),
               d_model=16)
    ours.router.weight.data.copy_(theirs.router.weight)
    ours.experts_in.data.copy_(theirs.experts.gate_up_proj)
    ours.experts_out.data.copy_(theirs.experts.down_proj)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
