"""biased_softmax_topk (ERNIE 4.5 MoE's router): the formula written out, and transformers' Ernie4_5_MoeTopKRouter."""

from __future__ import annotations

import math

import pytest
import torch

from specformer_layers.routers.biased_softmax_topk import BiasedSoftmaxTopK
from specformer_layers.routers.params import BiasedSoftmaxTopKParams

D, E, K = 12, 8, 3


def _router(seed: int = 0, **config) -> BiasedSoftmaxTopK:
    router = BiasedSoftmaxTopK(BiasedSoftmaxTopKParams(**config), d_model=D, n_experts=E, top_k=K).double()
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(seed),
                                        dtype=torch.float64))
        # Large enough to change which experts are chosen for some tokens.
        router.selection_bias.copy_(torch.randn(E, generator=torch.Generator().manual_seed(seed + 1)) * 0.3)
    return router


# norm_min 0.9: above the chosen probabilities' sum for most tokens, so the floor decides their weights.
@pytest.mark.parametrize("config", [{}, {"normalize": False}, {"scaling_factor": 2.0}, {"norm_min": 0.9}])
def test_biased_softmax_topk_is_the_formula(config: dict) -> None:
    router = _router(**config)
    tokens = torch.randn(30, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    weights, experts, probs = router(tokens)
    floored = 0
    for n, token in enumerate(tokens.tolist()):
        logits = [sum(w * x for w, x in zip(row, token)) for row in router.weight.tolist()]
        exps = [math.exp(v) for v in logits]
        p = [v / sum(exps) for v in exps]  # softmax over all experts
        biased = [s + b for s, b in zip(p, router.selection_bias.tolist())]  # chooses, never weighs
        chosen = sorted(range(E), key=lambda e: -biased[e])[:K]
        kept = sum(p[e] for e in chosen)
        floored += kept < config.get("norm_min", 1e-12)
        total = max(kept, config.get("norm_min", 1e-12)) if config.get("normalize", True) else 1.0
        want = {e: p[e] / total * config.get("scaling_factor", 1.0) for e in chosen}
        got = dict(zip(experts[n].tolist(), weights[n].tolist()))
        assert got.keys() == want.keys()
        assert [got[e] for e in want] == pytest.approx([want[e] for e in want], rel=1e-12)
        assert probs[n].tolist() == pytest.approx(p, rel=1e-12)
    if "norm_min" in config:
        assert floored > 0  # the case tests the floor, not only the sum


def test_the_selection_bias_changes_the_choice_not_the_weights() -> None:
    router = _router()
    tokens = torch.randn(30, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        router.selection_bias.zero_()
        router.selection_bias[0] = 10.0  # expert 0 always chosen
    weights, experts, probs = router(tokens)
    assert bool((experts == 0).any(dim=-1).all())
    torch.testing.assert_close(weights, probs.gather(1, experts) / probs.gather(1, experts).sum(-1, keepdim=True))


@pytest.mark.parametrize("norm_min", [1e-12, 0.9])
def test_biased_softmax_topk_matches_transformers(norm_min: float) -> None:
    from transformers import Ernie4_5_MoeConfig
    from transformers.models.ernie4_5_moe.modeling_ernie4_5_moe import Ernie4_5_MoeTopKRouter

    config = Ernie4_5_MoeConfig(hidden_size=D, moe_num_experts=E, moe_k=K, moe_norm_min=norm_min, num_hidden_layers=2)
    theirs = Ernie4_5_MoeTopKRouter(config)
    ours = _router(norm_min=norm_min).float()
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        theirs.moe_statics.e_score_correction_bias.copy_(ours.selection_bias[None])  # (1, E) in transformers
    tokens = torch.randn(40, D, generator=torch.Generator().manual_seed(4))
    _, their_weights, their_experts = theirs(tokens)
    weights, experts, _ = ours(tokens)
    order, their_order = experts.argsort(-1), their_experts.argsort(-1)
    assert torch.equal(experts.gather(1, order), their_experts.gather(1, their_order))
    torch.testing.assert_close(weights.gather(1, order), their_weights.gather(1, their_order), rtol=1e-5, atol=1e-6)
