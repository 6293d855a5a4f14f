"""The block-pooled indexer (``indexer: {kind: block_pooled}`` on ``attention``): Kolibri 1.1's block selection.

The chosen keys and the attention output are checked against the selection written out
here query by query (block means of key head 0, ReLU scores of the first query heads, the
query's unfinished block at 0, sink and local blocks forced, the top-k of the rest with ties
to the earliest block); the cache against recomputing; bad specs against their one line.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import specformer
from fixtures.tiny import tiny_spec
from specformer.errors import SpecError
from specformer.spec.check import check_spec
from specformer_layers.attention.masking import attention_mask

BS = 3


def pooled_spec(indexer: dict[str, Any] | None = None, n_layers: int = 1, **attention: Any) -> dict[str, Any]:
    index = {"kind": "block_pooled", "block_size": BS, "topk": 1, "sink_blocks": 1, "local_blocks": 1,
             "n_heads": 2, "block": 4, **(indexer or {})}
    spec = tiny_spec(n_layers=n_layers, block={"mixer": {"kind": "attention", "n_heads": 6, "n_kv_heads": 2, "head_dim": 8,
                                                         "indexer": index, **attention}})
    spec["model"]["positional"] = {"kind": "none"}
    return spec


def reference_keep(q: torch.Tensor, k: torch.Tensor, *, bs: int, topk: int, sinks: int, local: int,
                   n_heads: int) -> torch.Tensor:
    """(B, T, T) bool: the keys each query reads, one query at a time (positions 0..T-1, no padding)."""
    B, H, T, hd = q.shape
    keep = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        for t in range(T):
            own = t // bs
            scores = {}
            for j in range(own + 1):
                if (j + 1) * bs <= t + 1:  # complete at t: scored by its mean
                    mean = k[b, 0, j * bs:(j + 1) * bs].sum(0) / bs
                    scores[j] = sum(max(0.0, float(q[b, h, t] @ mean)) for h in range(n_heads)) / math.sqrt(hd) / n_heads
                else:  # the query's unfinished block competes with 0
                    scores[j] = 0.0
            forced = {j for j in scores if j < sinks or j > own - local}
            rest = sorted((j for j in scores if j not in forced), key=lambda j: (-scores[j], j))
            blocks = forced | set(rest[:topk])
            for s in range(t + 1):
                keep[b, t, s] = s // bs in blocks
    return keep


def _qkv(attn: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, _ = x.shape
    H, KV, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    q, k, v = (x @ attn.qkv.weight.T).split((H * hd, KV * hd, KV * hd), dim=-1)
    return (q.view(B, T, H, hd).transpose(1, 2), k.view(B, T, KV, hd).transpose(1, 2),
            v.view(B, T, KV, hd).transpose(1, 2))


def _model_and_input(spec: dict[str, Any], T: int, seed: int = 0) -> tuple[Any, Any, torch.Tensor, Any]:
    model = specformer.build(spec, seed=seed, dtype=torch.float64).eval()
    x = torch.randn(2, T, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    ctx = model._context(torch.arange(T).expand(2, T), cache=None, plain_causal=True)
    return model, model.blocks[0].mixer, x, ctx


@pytest.mark.parametrize(("indexer", "T"), [
    ({}, 17),  # 6 blocks, the last unfinished: sink + local + 1 of the rest, so blocks are dropped
    ({"topk": 2, "sink_blocks": 0, "local_blocks": 2, "n_heads": 3}, 14),
    ({"topk": 1, "sink_blocks": 0, "local_blocks": 0}, 10),  # the unfinished block competes with 0
])
def test_the_selection_and_the_output_are_the_formulas(indexer: dict[str, Any], T: int) -> None:
    spec = pooled_spec(indexer)
    params = spec["model"]["block"]["mixer"]["indexer"]
    model, attn, x, ctx = _model_and_input(spec, T)
    q, k, v = (t.detach() for t in _qkv(attn, x))
    want = reference_keep(q, k, bs=BS, topk=params["topk"], sinks=params["sink_blocks"],
                          local=params["local_blocks"], n_heads=params["n_heads"])
    with torch.no_grad():
        got = attn.indexer.select(q, k, ctx=ctx, k_positions=ctx.positions, rule=attn.mask_rule)[:, 0]
        got = got & attention_mask(ctx, ctx.positions, attn.mask_rule)[:, 0]
        assert torch.equal(got, want)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        assert (want != causal).any()  # some query drops a block it could read
        groups = attn.n_heads // attn.n_kv_heads
        logits = q @ k.repeat_interleave(groups, 1).transpose(-1, -2) * attn.head_dim ** -0.5
        probs = logits.masked_fill(~want[:, None], float("-inf")).softmax(-1)
        y = (probs @ v.repeat_interleave(groups, 1)).transpose(1, 2).reshape(2, T, -1) @ attn.out.weight.T
        torch.testing.assert_close(attn(x, ctx), y, rtol=1e-10, atol=1e-12)


def test_eager_and_sdpa_agree() -> None:
    _, attn, x, ctx = _model_and_input(pooled_spec(), 16)
    with torch.no_grad():
        sdpa = attn(x, ctx)
        attn.backend = "eager"
        torch.testing.assert_close(attn(x, ctx), sdpa, rtol=1e-10, atol=1e-12)


def test_generation_with_the_cache_equals_recompute_with_padding_and_a_window() -> None:
    from specformer_generate import generate

    spec = pooled_spec(n_layers=2, window=10)
    spec["model"]["positional"] = {"kind": "rope"}
    model = specformer.build(spec, seed=3, dtype=torch.float64).eval()
    prompts = [[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5], [6, 2], [5, 3, 5, 8, 9, 7, 9]]
    cached = generate(model, prompts, max_new_tokens=9)
    assert cached == generate(model, prompts, max_new_tokens=9, use_cache=False)
    assert cached == [generate(model, [p], max_new_tokens=9)[0] for p in prompts]


def test_training_runs_and_has_no_weights() -> None:
    model = specformer.build(pooled_spec(n_layers=2), seed=0)
    assert not list(model.blocks[0].mixer.indexer.parameters())
    ids = torch.randint(0, model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    model(ids).float().logsumexp(-1).mean().backward()
    assert model.blocks[0].mixer.qkv.weight.grad is not None


@pytest.mark.parametrize(("change", "says"), [
    ({"indexer": {"kind": "block_pooled", "block_size": 4, "topk": 2, "n_heads": 4}},
     "the indexer's n_heads (4) scores with the query heads of key head 0, of which there are 3"),
    ({"indexer": {"kind": "lightning", "topk": 2}}, "attention's indexer scores the layer's own queries and keys"),
    ({"indexer": {"kind": "block_pooled", "block_size": 4, "topk": 2}, "differential": True},
     "an indexer and differential attention do not combine"),
])
def test_bad_params_are_one_clear_line(change: dict[str, Any], says: str) -> None:
    spec = pooled_spec()
    spec["model"]["block"]["mixer"].update(change)
    with pytest.raises(SpecError) as info:
        check_spec(spec)
    assert len(info.value.problems) == 1
    assert says in info.value.problems[0].message, str(info.value.problems[0])


def test_mla_refuses_it() -> None:
    from tests.plugins.layers.attention.test_mla import mla_spec

    with pytest.raises(SpecError) as info:
        check_spec(mla_spec({"indexer": {"kind": "block_pooled", "block_size": 4, "topk": 2}}))
    assert "scores a plain attention's heads" in info.value.problems[0].message


def test_the_summary_counts_the_chosen_keys_and_the_choosing() -> None:
    """Per token and layer: 2 H (hd + hd) x the keys read ((topk + sink + local) blocks of 3) + per key of the
    context, pooling (2 hd) and scoring the block means with 2 heads (2 x 2 x hd / 3, floored)."""
    from specformer.model.summary import summarize

    summary = summarize(pooled_spec(n_layers=2))
    read, context, hd = 3 * BS, 32, 8
    assert summary.attention_flops_per_token == 2 * (2 * 6 * (hd + hd) * read + (2 * hd + 2 * 2 * hd // BS) * context)
    assert [kernel for _, kernel in summary.attention_kernels] == ["sdpa with the indexer's chosen keys as a dense mask"]


@pytest.mark.parametrize("stage", ["pool", "tokens"])
def test_it_chooses_what_transformers_kolibri_1_1_chooses_without_its_nvfp4_rounding(monkeypatch: Any,
                                                                                      stage: str) -> None:
    """Kolibri 1.1's two stages, each as one block_pooled selector: the pool (blocks of index_compression keys, the
    top index_pool_size / index_compression of them, no sink or local blocks) and the tokens within an all-visible
    pool (blocks of one key: index_topk, index_num_sink_tokens, index_num_local_tokens). Its NVFP4 rounding of the
    scored queries and keys is replaced by the identity: specformer does not round (coverage.MISSING says so)."""
    modeling = pytest.importorskip("transformers.models.kolibri1_1.modeling_kolibri1_1")
    from transformers import Kolibri1_1Config

    monkeypatch.setattr(modeling, "nvfp4_fake_quantize", lambda x: x)
    config = Kolibri1_1Config(vocab_size=50, hidden_size=32, num_hidden_layers=5, num_attention_heads=6,
                              num_key_value_heads=2, head_dim=16, index_num_heads=2, index_compression=3,
                              index_pool_size=6, index_topk=4, index_num_sink_tokens=2, index_num_local_tokens=3,
                              num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
                              shared_expert_intermediate_size=8, mlp_only_intermediate_size=8)
    theirs = modeling.Kolibri1_1Indexer(config, 4)  # layer 4: the model's one indexed (and indexer) layer
    if stage == "pool":
        ours = {"block_size": 3, "topk": 2, "sink_blocks": 0, "local_blocks": 0, "n_heads": 2}
    else:
        ours = {"block_size": 1, "topk": 4, "sink_blocks": 2, "local_blocks": 3, "n_heads": 2}
    spec = pooled_spec(ours, head_dim=16)
    B, T = 2, 17
    model, attn, _, ctx = _model_and_input(spec, T)
    generator = torch.Generator().manual_seed(5)
    q = torch.randn(B, 6, T, 16, dtype=torch.float64, generator=generator)
    k = torch.randn(B, 2, T, 16, dtype=torch.float64, generator=generator)
    visible = torch.ones(T, T, dtype=torch.bool).tril().expand(B, T, T)
    want = theirs.select_pool(q, k, visible) if stage == "pool" else theirs.select_tokens(q, k, visible, visible)
    got = attn.indexer.select(q, k, ctx=ctx, k_positions=ctx.positions, rule=attn.mask_rule)[:, 0] & visible
    assert torch.equal(got, want)
    assert (want != visible).any()  # it drops keys
