"""DeepSeek-V4's routers: sqrtsoftplus scoring and hash routing by token id, each against the formula written out
token by token and against transformers' DeepseekV4TopKRouter / DeepseekV4HashRouter; hash routing through a
Decoder (the token ids reach the moe through the forward context) and through the generation cache."""

from __future__ import annotations

import math

import pytest
import torch

import specformer
from fixtures.caching import cached_logits
from specformer_layers.routers.hash import HashRouter, fixed_hash
from specformer_layers.routers.params import HashParams, SqrtSoftplusTopKParams
from specformer_layers.routers.sqrtsoftplus_topk import SqrtSoftplusTopK

from ..support import tiny_spec_over_vocab

D, E, V = 12, 8, 30


def sqrtsoftplus(v: float) -> float:
    return math.sqrt(math.log1p(math.exp(v)))


def _randomised(router: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    router = router.double()
    with torch.no_grad():
        router.weight.copy_(torch.randn(router.weight.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return router


@pytest.mark.parametrize("config", [{}, {"normalize": False}, {"scaling_factor": 1.5}])
def test_sqrtsoftplus_topk_is_the_formula(config: dict) -> None:
    router = _randomised(SqrtSoftplusTopK(SqrtSoftplusTopKParams(**config), d_model=D, n_experts=E, top_k=3))
    router.selection_bias.copy_(torch.randn(E, generator=torch.Generator().manual_seed(1)) * 0.3)
    tokens = torch.randn(25, D, dtype=torch.float64)
    weights, experts, probs = router(tokens)
    for n, token in enumerate(tokens.tolist()):
        scores = [sqrtsoftplus(sum(w * x for w, x in zip(row, token))) for row in router.weight.tolist()]
        biased = [s + b for s, b in zip(scores, router.selection_bias.tolist())]  # chooses, never weighs
        chosen = sorted(range(E), key=lambda e: -biased[e])[:3]
        total = sum(scores[e] for e in chosen) if config.get("normalize", True) else 1.0
        want = {e: scores[e] / total * config.get("scaling_factor", 1.0) for e in chosen}
        got = dict(zip(experts[n].tolist(), weights[n].tolist()))
        assert got.keys() == want.keys()
        assert [got[e] for e in want] == pytest.approx([want[e] for e in want], rel=1e-12)
        assert probs[n].tolist() == pytest.approx([s / sum(scores) for s in scores], rel=1e-12)


def _v4_config(**changes):
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config

    return DeepseekV4Config(hidden_size=D, n_routed_experts=E, num_experts_per_tok=3, vocab_size=V,
                            routed_scaling_factor=1.5, num_hidden_layers=2, **changes)


def test_sqrtsoftplus_topk_matches_transformers() -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

    theirs = DeepseekV4TopKRouter(_v4_config()).double()
    ours = _randomised(SqrtSoftplusTopK(SqrtSoftplusTopKParams(scaling_factor=1.5), d_model=D, n_experts=E, top_k=3))
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        bias = torch.randn(E, generator=torch.Generator().manual_seed(5)) * 0.3
        theirs.e_score_correction_bias.copy_(bias)
        ours.selection_bias.copy_(bias)
    tokens = torch.randn(20, D, dtype=torch.float64)
    _, their_weights, their_experts = theirs(tokens)
    weights, experts, _ = ours(tokens)
    order, their_order = experts.argsort(-1), their_experts.argsort(-1)  # theirs is unsorted
    assert torch.equal(experts.gather(1, order), their_experts.gather(1, their_order))
    torch.testing.assert_close(weights.gather(1, order), their_weights.gather(1, their_order).double(), rtol=1e-6, atol=1e-7)


def test_the_fixed_hash_is_its_formula_and_spreads_the_vocabulary() -> None:
    table = fixed_hash(1000, n_experts=E, top_k=3)
    for t in (0, 1, 7, 999):
        first = (t * 2654435761) % 2 ** 32 % E
        assert table[t].tolist() == [(first + j) % E for j in range(3)]
    counts = torch.bincount(table[:, 0], minlength=E)
    assert counts.min() > 1000 / E * 0.8  # every expert gets a share


@pytest.mark.parametrize("scoring", ["sqrtsoftplus", "sigmoid", "softmax"])
def test_hash_router_is_the_formula(scoring: str) -> None:
    router = _randomised(HashRouter(HashParams(scoring=scoring, scaling_factor=1.5), d_model=D, n_experts=E, top_k=3,
                                    vocab_size=V))
    router.token_experts.copy_(torch.stack([torch.randperm(E, generator=torch.Generator().manual_seed(t))[:3] for t in range(V)]))
    tokens = torch.randn(25, D, dtype=torch.float64)
    ids = torch.randint(0, V, (25,))
    weights, experts, _ = router(tokens, token_ids=ids)
    for n, token in enumerate(tokens.tolist()):
        logits = [sum(w * x for w, x in zip(row, token)) for row in router.weight.tolist()]
        if scoring == "sqrtsoftplus":
            scores = [sqrtsoftplus(v) for v in logits]
        elif scoring == "sigmoid":
            scores = [1 / (1 + math.exp(-v)) for v in logits]
        else:
            scores = [math.exp(v) / sum(math.exp(u) for u in logits) for v in logits]
        chosen = router.token_experts[ids[n]].tolist()  # by the token's id, whatever the scores
        total = sum(scores[e] for e in chosen)
        assert experts[n].tolist() == chosen
        assert weights[n].tolist() == pytest.approx([scores[e] / total * 1.5 for e in chosen], rel=1e-12)


def test_hash_router_matches_transformers() -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4HashRouter

    theirs = DeepseekV4HashRouter(_v4_config()).double()
    ours = _randomised(HashRouter(HashParams(scaling_factor=1.5), d_model=D, n_experts=E, top_k=3, vocab_size=V))
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        theirs.tid2eid.copy_(ours.token_experts)  # same shape: (vocab_size, top_k)
    tokens = torch.randn(2, 5, D, dtype=torch.float64)
    ids = torch.randint(0, V, (2, 5))
    _, their_weights, their_experts = theirs(tokens, ids)
    weights, experts, _ = ours(tokens.view(-1, D), token_ids=ids.view(-1))
    assert torch.equal(experts, their_experts)
    torch.testing.assert_close(weights, their_weights, rtol=1e-12, atol=1e-12)


def _hash_model(seed: int) -> torch.nn.Module:
    ffn = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "router": {"kind": "hash", "scaling_factor": 1.5}}
    spec = tiny_spec_over_vocab(layers=[{"select": 0, "ffn": ffn}])
    return specformer.build(spec, seed=seed).double().eval()


@torch.no_grad()
def test_a_decoder_hands_the_hash_router_its_token_ids() -> None:
    model = _hash_model(0)
    moe = model.blocks[0].ffn
    assert moe.router.token_experts.shape == (model.vocab_size, 2)
    assert torch.equal(moe.router.token_experts, fixed_hash(model.vocab_size, n_experts=4, top_k=2))
    seen = []
    moe.router.register_forward_hook(lambda module, args, kwargs, out: seen.append((kwargs["token_ids"], out.experts)),
                                     with_kwargs=True)
    ids = torch.randint(0, model.vocab_size, (2, 6))
    model(ids)
    token_ids, experts = seen[0]
    assert torch.equal(token_ids, ids.reshape(-1))
    assert torch.equal(experts, moe.router.token_experts[ids.reshape(-1)])


@torch.no_grad()
def test_hash_routing_decodes_through_the_cache_as_recompute() -> None:
    from specformer_generate import generate

    model = _hash_model(1)
    ids = torch.randint(0, model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(cached_logits(model, ids, prompt=4)[0], model(ids), rtol=1e-9, atol=1e-9)
    prompts = [[3, 1, 4, 1, 5], [6], [5, 3]]
    assert generate(model, prompts, max_new_tokens=4) == [generate(model, [p], max_new_tokens=4)[0] for p in prompts]


def test_a_moe_called_without_a_decoder_says_what_hash_routing_needs() -> None:
    moe = _hash_model(0).blocks[0].ffn
    with pytest.raises(ValueError, match="reads token ids: run it inside a Decoder"):
        moe(torch.randn(1, 3, 32, dtype=torch.float64))
