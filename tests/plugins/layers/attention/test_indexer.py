"""Sparse attention by a lightning indexer (``indexer: {kind: lightning}``, DeepSeek-V3.2): the formula, the cache.

The formula (DeepSeek-V3.2, arXiv:2512.02556, section 2.1), for query t and key s <= t:

    qI_t,h = RoPE_halves(W_qI cq_t)            indexer query per head, from MLA's query latent cq_t
    kI_s   = RoPE_halves(LayerNorm(W_kI x_s))  one indexer key per token (cached)
    w_t,h  = (W_w x_t)_h / sqrt(H_I)
    I_t,s  = sum_h w_t,h relu(qI_t,h . kI_s / sqrt(D_I))
    S_t    = the topk keys s <= t of highest I_t,s (all of them when there are at most topk)
    o_t    = MLA's attention of query t over the keys in S_t only

Only the first qk_rope_head_dim channels of qI and kI turn, in halves (a_i, a_{i+n}), while
MLA's own rotary channels turn in adjacent pairs (DeepSeek-V3's interleaved layout).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.spec.check import check_spec
from specformer.model.summary import summarize
from specformer_layers.attention.indexer import top_slots

from tests.plugins.layers.attention.test_mla import mla_spec

INDEXER = {"kind": "lightning", "topk": 4, "n_heads": 3, "head_dim": 6, "block": 5}


def indexed_spec(indexer: dict[str, Any] | None = None, **attention: Any) -> dict[str, Any]:
    return mla_spec({"indexer": {**INDEXER, **(indexer or {})}, **attention})


def _rotate(v: torch.Tensor, T: int, *, interleaved: bool, theta: float = 10000.0) -> torch.Tensor:
    """RoPE on all of ``v`` (..., T, d): pairs (2i, 2i+1) when interleaved, else (i, i + d/2); as complex numbers."""
    d = v.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(T, dtype=torch.float64)[:, None] * freqs  # (T, d/2)
    turn = torch.polar(torch.ones_like(angle), angle)
    if interleaved:
        pairs = torch.view_as_complex(v.reshape(*v.shape[:-1], d // 2, 2).contiguous())
        return torch.view_as_real(pairs * turn).flatten(-2)
    pairs = torch.complex(v[..., : d // 2], v[..., d // 2:]) * turn
    return torch.cat((pairs.real, pairs.imag), dim=-1)


def reference_index(attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``S_t`` as a boolean (B, T, T) and the scores ``I`` (B, T, T): written out head by head, the topk by a stable sort."""
    B, T, _ = x.shape
    ix, rope = attn.indexer, attn.qk_rope_head_dim
    Hi, D = ix.n_heads, ix.key_dim

    def rms(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def turn_front(v: torch.Tensor) -> torch.Tensor:
        return torch.cat((_rotate(v[..., :rope], T, interleaved=False), v[..., rope:]), dim=-1)

    cq = rms(x @ attn.q_a.weight.T, attn.q_norm.weight)  # (B, T, q_lora_rank)
    k = torch.nn.functional.layer_norm(x @ ix.k_proj.weight.T, (D,), ix.k_norm.weight, ix.k_norm.bias, eps=1e-6)
    k = turn_front(k)  # (B, T, D)
    w = (x @ ix.weights_proj.weight.T) / math.sqrt(Hi)  # (B, T, Hi)
    scores = torch.zeros(B, T, T, dtype=torch.float64)
    for h in range(Hi):
        q_h = turn_front((cq @ ix.q_proj.weight.T)[..., h * D:(h + 1) * D])  # (B, T, D)
        scores += w[..., h, None] * torch.relu(q_h @ k.transpose(1, 2) / math.sqrt(D))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    order = torch.sort(-scores, dim=-1, stable=True).indices[..., : ix.topk]  # ties: the earlier key
    chosen = torch.zeros(B, T, T, dtype=torch.bool).scatter(-1, order, True)
    return chosen & causal, scores


def reference_selection(attn: Any, x: torch.Tensor) -> torch.Tensor:
    """``S_t`` as a boolean (B, T, T)."""
    return reference_index(attn, x)[0]


def reference_indexed_mla(attn: Any, x: torch.Tensor, weights: list[torch.Tensor] | None = None) -> torch.Tensor:
    """MLA's formula head by head (tests/plugins/layers/attention/test_mla.py), each query over its ``S_t``.

    ``weights`` (when given) receives each head's attention weights (B, T, T).
    """
    B, T, _ = x.shape
    H, nope, rope, vd = attn.n_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim
    readable = reference_selection(attn, x)  # (B, T, T)

    def rms(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    c_and_kr = x @ attn.kv_a.weight.T
    c = rms(c_and_kr[..., : attn.kv_lora_rank], attn.kv_norm.weight)
    kr = _rotate(c_and_kr[..., attn.kv_lora_rank:], T, interleaved=True)
    q = rms(x @ attn.q_a.weight.T, attn.q_norm.weight) @ attn.q_b.weight.T
    w_b = attn.kv_b.weight.view(H, nope + vd, attn.kv_lora_rank)
    outputs = []
    for h in range(H):
        q_h = q[..., h * (nope + rope):(h + 1) * (nope + rope)]
        q_h = torch.cat((q_h[..., :nope], _rotate(q_h[..., nope:], T, interleaved=True)), -1)
        k_h = torch.cat((c @ w_b[h, :nope].T, kr), -1)
        scores = (q_h @ k_h.transpose(1, 2) / math.sqrt(nope + rope)).masked_fill(~readable, float("-inf"))
        probs = torch.softmax(scores, -1)
        if weights is not None:
            weights.append(probs)
        outputs.append(probs @ (c @ w_b[h, nope:].T))
    return torch.cat(outputs, -1) @ attn.out.weight.T


def _attention_and_input(spec: dict[str, Any], T: int) -> tuple[Any, Any, torch.Tensor]:
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    x = torch.randn(2, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    return model, model.blocks[0].mixer, x


@pytest.mark.parametrize("T", [13, 4])
def test_matches_the_formula(T: int) -> None:
    """13 queries in blocks of 5 reading 4 keys each; 4 queries: every allowed key is chosen (dense attention)."""
    model, attn, x = _attention_and_input(indexed_spec(), T)
    ctx = model._context(torch.arange(T).expand(2, T), cache=None, plain_causal=True)
    with torch.no_grad():
        # RoPE angles are float32 by design (specformer_layers.positional.fp32), hence not 1e-12.
        torch.testing.assert_close(attn(x, ctx), reference_indexed_mla(attn, x), rtol=1e-5, atol=1e-7)


def test_the_selection_is_the_formulas_and_sparse() -> None:
    model, attn, x = _attention_and_input(indexed_spec(), 13)
    with torch.no_grad():
        got = selected(model, attn, x)
    want = reference_selection(attn, x)
    assert torch.equal(got, want)
    assert torch.equal(want.sum(-1), torch.arange(1, 14).clamp(max=4).expand(2, 13))  # topk of the allowed keys


def attn_rule(attn: Any) -> Any:
    from specformer.model.masks import MaskRule

    return MaskRule(window=attn.window)


def test_the_eager_path_of_an_inspector_gives_the_same_output_and_the_chosen_weights() -> None:
    model, attn, x = _attention_and_input(indexed_spec(), 13)
    ctx = model._context(torch.arange(13).expand(2, 13), cache=None, plain_causal=True)
    seen: list[torch.Tensor] = []
    with torch.no_grad():
        plain = attn(x, ctx)
        attn.observe_weights = seen.append
        observed = attn(x, ctx)
    torch.testing.assert_close(observed, plain, rtol=1e-10, atol=1e-12)
    assert torch.equal(seen[0][:, 0] > 0, reference_selection(attn, x))


def test_ties_at_the_cut_go_to_the_earliest_slots() -> None:
    scores = torch.tensor([[0.0, 2.0, 0.0, 0.0, 1.0, 0.0], [float("-inf")] * 2 + [5.0] + [float("-inf")] * 3])
    assert top_slots(scores, 3).tolist() == [[0, 1, 4], [0, 1, 2]]


def selected(model: Any, attn: Any, x: torch.Tensor) -> torch.Tensor:
    """The keys the indexer chose for each query, as a boolean (B, T, T), from its block-wise selections."""
    B, T, _ = x.shape
    ctx = model._context(torch.arange(T).expand(B, T), cache=None, plain_causal=True)
    positional, state = ctx.positional_for(0), ctx.positional_state_for(0)
    cq = attn.q_norm(attn.q_a(x))
    keys = attn.indexer.keys(x, positional, state)
    got = torch.zeros(B, T, T, dtype=torch.bool)
    for rows, chosen, readable in attn.indexer.selections(x, cq, keys, ctx=ctx, k_positions=ctx.positions,
                                                          rule=attn_rule(attn), positional=positional, state=state):
        got[:, rows] = got[:, rows].scatter(-1, chosen, readable)
    return got


def test_topk_ties_take_what_torch_topk_takes_over_the_whole_row_whatever_the_block() -> None:
    """``ties: topk`` (what transformers' DeepSeek-V3.2 does): one indexer head, so about half the keys score
    exactly 0 and many queries tie at their cut; every block size chooses the keys torch.topk returns from the
    query's whole causal row (-inf past it), as one forward of transformers over those keys would."""
    T, k = 24, 4
    chosen_by_block = []
    for block in (1, 5, T):
        model, attn, x = _attention_and_input(indexed_spec({"n_heads": 1, "ties": "topk", "block": block}), T)
        with torch.no_grad():
            chosen_by_block.append(selected(model, attn, x))
    _, scores = reference_index(attn, x)  # (B, T, T), -inf after each query
    top = scores.topk(k, dim=-1)
    tied = (scores >= top.values[..., -1:]).sum(-1) > k  # (B, T): more keys at the cut than it has room for
    assert int(tied.sum()) >= 5, "too few queries tie at the cut to test tie-breaking"
    # torch.topk's choice depends only on the order of the scores, which the reference's float64 formula shares;
    # slots past the query (when it has fewer than k keys) are dropped by the causal mask.
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    want = torch.zeros(2, T, T, dtype=torch.bool).scatter(-1, top.indices, True) & causal
    for chosen in chosen_by_block:
        assert torch.equal(chosen, want)


def test_generation_with_the_cache_equals_recompute_with_padding_and_a_window() -> None:
    from specformer_generate import generate

    model = specformer.build(indexed_spec(window=6), seed=3, dtype=torch.float64).eval()
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [6, 2], [5, 3, 5, 8, 9]]
    cached = generate(model, prompts, max_new_tokens=8)
    assert cached == generate(model, prompts, max_new_tokens=8, use_cache=False)
    assert cached == [generate(model, [p], max_new_tokens=8)[0] for p in prompts]


def test_the_cache_keeps_the_indexer_keys_beside_the_latent_and_the_rotary_key() -> None:
    """bytes/token/layer = (kv_lora_rank + qk_rope_head_dim + indexer head_dim) x dtype size."""
    from specformer_generate.cache import StaticKVCache

    spec = indexed_spec()
    assert summarize(spec).kv_bytes_per_token(torch.bfloat16) == 2 * (12 + 4 + 6) * 2
    model = specformer.build(spec, seed=0)
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=10)
    assert cache.nbytes == 2 * 10 * (12 + 4 + 6) * 4 + 10 * 8  # and one slot-position table


@pytest.mark.parametrize(("change", "where", "says"), [
    ({"indexer": {**INDEXER, "topk": 0}}, "model.block.mixer.indexer.topk", "greater than 0"),
    ({"indexer": {**INDEXER, "head_dim": 2}}, "model.block.mixer",
     "the indexer's head_dim (2) must hold the attention's 4 rotary channels"),
    ({"indexer": "rmsnorm"}, "model.block.mixer.indexer.kind", "is a norm, not an indexer"),
])
def test_bad_params_are_one_clear_line(change: dict[str, Any], where: str, says: str) -> None:
    spec = mla_spec({"indexer": INDEXER, **change})
    with pytest.raises(SpecError) as info:
        check_spec(spec)  # sizes too: the indexer is sized by the attention
    assert len(info.value.problems) == 1
    problem = info.value.problems[0]
    assert problem.path == where and says in problem.message, str(problem)


def test_the_indexer_learns_from_its_own_loss_only() -> None:
    """Training: KL(attention over S_t, summed over heads and normalised || softmax of I over S_t), averaged over
    queries, is the indexer's auxiliary loss; it reaches only the indexer, the language-model loss never does."""
    model, attn, x = _attention_and_input(indexed_spec(indexer={"loss_coef": 0.5}), 13)
    model.train()
    ctx = model._context(torch.arange(13).expand(2, 13), cache=None, plain_causal=True)
    out = attn(x, ctx)
    heads: list[torch.Tensor] = []
    with torch.no_grad():
        reference_indexed_mla(attn, x, heads)
        chosen, scores = reference_index(attn, x)
        p = torch.stack(heads).sum(0).masked_fill(~chosen, 0.0)
        p = p / p.sum(-1, keepdim=True)
        log_q = torch.log_softmax(scores.masked_fill(~chosen, float("-inf")), -1)
        kl = torch.where(chosen, p * (torch.log(p) - log_q), 0.0).sum(-1)  # (B, T)
    # The indexer scores in float32, as transformers does, whatever the model dtype.
    torch.testing.assert_close(attn.indexer.aux_loss.detach().double(), 0.5 * kl.mean(), rtol=1e-5, atol=1e-7)

    indexer_params = {id(p) for p in attn.indexer.parameters()}
    out.square().sum().backward(retain_graph=True)
    assert all(p.grad is None for p in attn.indexer.parameters())
    assert all(p.grad is not None for p in attn.parameters() if id(p) not in indexer_params)
    model.zero_grad(set_to_none=True)
    attn.indexer.aux_loss.backward()
    assert all(p.grad is not None for p in attn.indexer.parameters())
    assert all(p.grad is None for p in attn.parameters() if id(p) not in indexer_params)


def test_a_scheme_that_biases_scores_is_refused_once_keys_are_chosen() -> None:
    spec = indexed_spec()
    spec["model"]["positional"] = {"kind": "alibi"}
    model = specformer.build(spec, seed=0).eval()
    ids = torch.randint(0, 53, (1, 12), generator=torch.Generator().manual_seed(0))
    model(ids[:, :4])  # every key chosen: dense attention, which adds the bias
    with pytest.raises(ValueError, match="sparse attention .* adds no positional bias .* ALiBi biases them"):
        model(ids)
