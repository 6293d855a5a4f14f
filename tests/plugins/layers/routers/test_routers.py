"""The built-in routers against routing written out token by token, and their bad specs."""

from __future__ import annotations

import math

import pytest
import torch

import specformer
from specformer_layers.routers.sigmoid_topk import SigmoidTopK
from specformer_layers.routers.softmax_topk import SoftmaxTopK

from ..support import tiny_spec_over_vocab

D, E = 12, 8


def _softmax(values: list[float]) -> list[float]:
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    return [v / sum(exps) for v in exps]


def _best(candidates: list[int], score: list[float], k: int) -> list[int]:
    return sorted(candidates, key=lambda e: -score[e])[:k]


def _kept_groups(score: list[float], n_group: int, topk_group: int, group_score: str) -> list[int]:
    """The experts of the ``topk_group`` best groups, a group scored by its best one or its best two."""
    size = len(score) // n_group
    def group_value(g: int) -> float:
        members = sorted(score[g * size:(g + 1) * size], reverse=True)
        return members[0] if group_score == "max" else members[0] + members[1]
    groups = sorted(range(n_group), key=lambda g: -group_value(g))[:topk_group]
    return [e for e in range(len(score)) if e // size in groups]


def softmax_reference(router: SoftmaxTopK, token: list[float]) -> tuple[dict[int, float], list[float]]:
    """``{expert: weight}`` and the probabilities of one token, from the formula."""
    weight = router.weight.tolist()
    bias = router.bias.tolist() if router.bias is not None else [0.0] * E
    logits = [sum(w * x for w, x in zip(row, token)) + b for row, b in zip(weight, bias)]
    probs = _softmax(logits)
    candidates = list(range(E))
    if router.n_group > 1:
        candidates = _kept_groups(probs, router.n_group, router.topk_group, "max")
    chosen = _best(candidates, probs, router.top_k)
    total = sum(probs[e] for e in chosen) if router.normalize else 1.0
    return {e: probs[e] / total * router.scaling_factor for e in chosen}, probs


def sigmoid_reference(router: SigmoidTopK, token: list[float]) -> tuple[dict[int, float], list[float]]:
    weight = router.weight.tolist()
    selection = router.selection_bias.tolist() if router.selection_bias is not None else [0.0] * E
    bias = router.bias.tolist() if router.bias is not None else [0.0] * E
    logits = [sum(w * x for w, x in zip(row, token)) + b for row, b in zip(weight, bias)]
    if router.logit_softcap is not None:  # cap * tanh(logit / cap)
        logits = [router.logit_softcap * math.tanh(v / router.logit_softcap) for v in logits]
    scores = [1 / (1 + math.exp(-v)) for v in logits]
    biased = [s + b for s, b in zip(scores, selection)]  # used for choosing only
    candidates = list(range(E))
    if router.n_group > 1:
        candidates = _kept_groups(biased, router.n_group, router.topk_group, "top2_sum")
    chosen = _best(candidates, biased, router.top_k)
    total = sum(scores[e] for e in chosen) if router.normalize else 1.0
    return {e: scores[e] / total * router.scaling_factor for e in chosen}, [s / sum(scores) for s in scores]


def _check(router: torch.nn.Module, reference, tokens: torch.Tensor) -> None:
    weights, experts, probs = router(tokens)
    assert weights.shape == experts.shape == (len(tokens), router.top_k)
    for n, token in enumerate(tokens.tolist()):
        expected, expected_probs = reference(router, token)
        got = dict(zip(experts[n].tolist(), weights[n].tolist()))
        assert got.keys() == expected.keys(), f"token {n}: chose {sorted(got)}, formula {sorted(expected)}"
        for e in expected:
            assert got[e] == pytest.approx(expected[e], rel=1e-12, abs=1e-12)
        assert probs[n].tolist() == pytest.approx(expected_probs, rel=1e-12, abs=1e-12)


def make(cls: type, *, top_k: int, **params: object) -> torch.nn.Module:
    """A router of ``E`` experts over ``D`` channels, from its Params (``cls.Params``) and its sizes."""
    return cls(cls.Params(**params), d_model=D, n_experts=E, top_k=top_k)


def _randomise(router: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    generator = torch.Generator().manual_seed(seed)
    router = router.double()
    with torch.no_grad():
        for p in router.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype))
    return router


SOFTMAX = [
    {"top_k": 2},
    {"top_k": 3, "normalize": False},
    {"top_k": 2, "bias": True},  # gpt-oss
    {"top_k": 4, "normalize": False, "scaling_factor": 16.0, "n_group": 4, "topk_group": 2},  # DeepSeek-V2
    {"top_k": 1, "n_group": 8, "topk_group": 3},
]


@pytest.mark.parametrize("config", SOFTMAX)
def test_softmax_topk_matches_formula(config: dict) -> None:
    router = _randomise(make(SoftmaxTopK, **config))
    _check(router, softmax_reference, torch.randn(40, D, dtype=torch.float64))


SIGMOID = [
    {"top_k": 2},
    {"top_k": 3, "normalize": False},
    {"top_k": 4, "scaling_factor": 2.5, "n_group": 4, "topk_group": 2},  # DeepSeek-V3's shape, scaled down
    {"top_k": 2, "n_group": 2, "topk_group": 1, "bias": True},
    {"top_k": 3, "selection_bias": False},  # Flint: the plain scores choose
    {"top_k": 2, "logit_softcap": 0.5},  # Laguna's router softcap, small enough to bound the random logits
]


@pytest.mark.parametrize("config", SIGMOID)
@pytest.mark.parametrize("with_selection_bias", [False, True])
def test_sigmoid_topk_matches_formula(config: dict, with_selection_bias: bool) -> None:
    router = _randomise(make(SigmoidTopK, **config))
    if with_selection_bias and router.selection_bias is not None:  # large enough to change choices and group ranking
        router.selection_bias.copy_(torch.randn(E, generator=torch.Generator().manual_seed(3)) * 0.3)
    _check(router, sigmoid_reference, torch.randn(40, D, dtype=torch.float64))


def test_grouping_changes_the_choice() -> None:
    """With one group kept of four, some tokens lose an expert they would otherwise take (the test bites)."""
    tokens = torch.randn(40, D, dtype=torch.float64)
    free = _randomise(make(SoftmaxTopK, top_k=2))
    grouped = _randomise(make(SoftmaxTopK, top_k=2, n_group=4, topk_group=1))
    assert not torch.equal(free(tokens).experts.sort().values, grouped(tokens).experts.sort().values)
    # Every chosen pair lies in one group of two.
    assert (grouped(tokens).experts // 2).unique(dim=1).shape[1] == 1


def test_selection_bias_chooses_but_does_not_weigh() -> None:
    router = _randomise(make(SigmoidTopK, top_k=2, normalize=False))
    tokens = torch.randn(30, D, dtype=torch.float64)
    router.selection_bias[5] = 10.0  # dominates any sigmoid score
    weights, experts, _ = router(tokens)
    assert (experts == 5).any(dim=1).all()
    chosen_five = weights[experts == 5]
    plain = torch.sigmoid(tokens @ router.weight[5])
    torch.testing.assert_close(chosen_five, plain)  # the weight is the unbiased score


def test_selection_bias_on_the_logits_picks_by_logit_plus_bias() -> None:
    # Kolibri-1: top-k of x W^T + bias (a bias of 1 moves an expert far more on the logit scale than on the sigmoid's).
    router = _randomise(make(SigmoidTopK, top_k=2, normalize=True, bias_on="logit"))
    with torch.no_grad():
        router.selection_bias.copy_(torch.linspace(-1.5, 1.5, E))
    tokens = torch.randn(30, D, dtype=torch.float64)
    weights, experts, _ = router(tokens)
    for t in range(len(tokens)):
        logits = [float(tokens[t] @ router.weight[e]) for e in range(E)]
        chosen = _best(list(range(E)), [l + float(b) for l, b in zip(logits, router.selection_bias)], 2)
        assert sorted(experts[t].tolist()) == sorted(chosen)
        scores = {e: 1 / (1 + math.exp(-logits[e])) for e in chosen}
        for e, w in zip(experts[t].tolist(), weights[t].tolist()):
            assert w == pytest.approx(scores[e] / sum(scores.values()), rel=1e-12)
    on_scores = make(SigmoidTopK, top_k=2, normalize=True)
    on_scores.load_state_dict(router.state_dict())
    assert not torch.equal(on_scores.double()(tokens).experts, experts)  # the same bias on the scores picks otherwise


def test_selection_bias_stays_float32_is_saved_and_reset_by_init() -> None:
    router = make(SigmoidTopK, top_k=2)
    router.selection_bias.fill_(0.1234567)
    cast = router.to(torch.bfloat16)
    assert cast.selection_bias.dtype == torch.float32
    assert cast.selection_bias[0].item() == pytest.approx(0.1234567, rel=1e-7)  # bfloat16 would give 0.1235
    assert "selection_bias" in router.state_dict()
    router.init_weights(std=0.02, residual_std=0.01)
    assert router.selection_bias.abs().sum() == 0


def test_without_a_selection_bias_the_router_holds_no_bias_and_observes_no_load() -> None:
    """selection_bias: false (Flint): nothing in the state dict for a checkpoint to fill, nothing for training to move."""
    router = make(SigmoidTopK, top_k=3, selection_bias=False)
    assert set(router.state_dict()) == {"weight"}
    router.train()(torch.randn(10, D))
    assert router.observed_load is None
    assert router.to(torch.bfloat16).selection_bias is None
    router.init_weights(std=0.02, residual_std=0.01)  # nothing to reset


def test_load_is_observed_only_while_training_with_a_rate() -> None:
    tokens = torch.randn(10, D)
    router = make(SigmoidTopK, top_k=3)
    router.eval()(tokens)
    assert router.observed_load is None
    router.train()
    _, experts, _ = router(tokens)
    router(tokens)
    expected = torch.bincount(experts.flatten(), minlength=E).float() * 2  # two forwards add up
    torch.testing.assert_close(router.observed_load, expected)
    fixed = make(SigmoidTopK, top_k=3, bias_update_rate=0.0).train()
    fixed(tokens)
    assert fixed.observed_load is None


def test_moe_with_a_router_uses_it() -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 8, "top_k": 2, "hidden": 16,
                                     "router": {"kind": "sigmoid_topk", "n_group": 4, "topk_group": 2,
                                                "scaling_factor": 2.5}}
    moe = specformer.build(spec, seed=0).blocks[0].ffn
    assert isinstance(moe.router, SigmoidTopK)
    assert (moe.router.n_experts, moe.router.top_k, moe.router.n_group, moe.router.scaling_factor) == (8, 2, 4, 2.5)


def test_default_router_is_the_softmax_router_of_the_shorthand() -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "normalize_topk": False}
    router = specformer.build(spec, seed=0).blocks[0].ffn.router
    assert isinstance(router, SoftmaxTopK) and router.normalize is False
    assert router.bias is None and router.scaling_factor == 1.0


@pytest.mark.parametrize(("router", "message"), [
    ({"kind": "sigmoid_topk", "n_group": 2, "topk_group": 3}, r"topk_group \(3\) cannot exceed n_group \(2\)"),
    ({"kind": "softmax_topk", "n_group": 3, "topk_group": 1}, r"n_group \(3\) must divide n_experts \(8\)"),
    ({"kind": "softmax_topk", "n_group": 4, "topk_group": 1, "top_k": 3}, "top_k"),  # top_k is the moe's
    ({"kind": "sigmoid_topk", "n_group": 8, "topk_group": 2}, r"needs at least 2 experts; n_experts \(8\) gives 1"),
    ({"kind": "sigmoid_topk", "bias_update_rate": -0.1}, "bias_update_rate"),
    ({"kind": "softmax_topk", "scaling_factor": 0}, "scaling_factor"),
    ({"kind": "hash", "scoring": "relu"}, r"scoring.*'sqrtsoftplus', 'sigmoid' or 'softmax'"),
    ({"kind": "hash", "scaling_factor": 0}, "scaling_factor"),
    ({"kind": "sqrtsoftplus_topk", "n_group": 3, "topk_group": 1}, r"n_group \(3\) must divide n_experts \(8\)"),
    ({"kind": "topk_sigmoid", "weights_on": "both"}, r"weights_on.*'input' or 'output'"),
    ({"kind": "topk_sigmoid", "normalize": True}, "normalize"),
])
def test_bad_router_specs(router: dict, message: str) -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 8, "top_k": 2, "hidden": 16, "router": router}
    with pytest.raises(specformer.SpecError, match=message) as info:
        specformer.load_spec(spec)
    assert len(info.value.problems) == 1, str(info.value)


def test_too_few_experts_in_the_kept_groups_is_one_line() -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 8, "top_k": 3, "hidden": 16,
                                     "router": {"kind": "softmax_topk", "n_group": 4, "topk_group": 1}}
    with pytest.raises(specformer.SpecError, match=r"top_k \(3\) exceeds the experts of the topk_group \(1\) kept "
                                                   r"groups \(1 x 2 = 2\)") as info:
        specformer.load_spec(spec)
    assert "model.block.ffn" in str(info.value)


def test_the_grouped_top_k_routers_share_one_declaration_of_their_common_settings() -> None:
    from specformer_layers.routers.base import GroupedTopK
    from specformer_layers.routers.params import GroupedParams, SigmoidTopKParams, SoftmaxTopKParams

    shared = ["n_group", "topk_group", "normalize", "bias", "scaling_factor"]
    assert list(GroupedParams.model_fields) == shared
    assert list(SoftmaxTopKParams.model_fields) == shared
    assert list(SigmoidTopKParams.model_fields) == [*shared, "bias_on", "bias_update_rate", "logit_softcap",
                                                    "selection_bias"]
    for name in shared:  # one description each, the same in both catalogue entries
        declared = [repr(p.model_fields[name]) for p in (GroupedParams, SoftmaxTopKParams, SigmoidTopKParams)]
        assert len(set(declared)) == 1, declared
    settings = dict(normalize=False, bias=True, scaling_factor=2.5, n_group=2, topk_group=1)
    for router in (SoftmaxTopK(SoftmaxTopKParams(**settings), d_model=D, n_experts=E, top_k=2),
                   SigmoidTopK(SigmoidTopKParams(**settings), d_model=D, n_experts=E, top_k=2)):
        assert isinstance(router, GroupedTopK) and router.bias is not None
        assert (router.normalize, router.scaling_factor, router.n_group, router.topk_group) == (False, 2.5, 2, 1)
        assert "normalize=False, scaling_factor=2.5, n_group=2, topk_group=1" in repr(router)
