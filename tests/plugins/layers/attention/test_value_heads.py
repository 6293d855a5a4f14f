"""Value heads of their own width (v_head_dim) and the value scale (MiMo-V2-Flash), against the formula written out."""

from __future__ import annotations

import copy

import pytest
import torch
from pydantic import ValidationError

import specformer
from specformer.model.attention import CacheSlots, cache_slots_of
from specformer.model.parallel_plan import plan_of
from specformer.model.tensor_parallel import FusedColwiseParallel, styles_from_plan
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.positional.rope import RotaryPositions

from fixtures.caching import cached_logits

from ..support import ListCache, causal_positions, context, tiny_spec_over_vocab
from .test_causal import D

H, KV, HD, VD, SCALE = 4, 2, 6, 10, 0.7


def make(**kwargs: object) -> CausalSelfAttention:
    params = {"n_heads": H, "n_kv_heads": KV, "head_dim": HD, "v_head_dim": VD, "value_scale": SCALE, **kwargs}
    attention = CausalSelfAttention(CausalSelfAttentionParams(**params), d_model=D).double()
    for p in attention.parameters():
        p.data.normal_(0, 0.3)
    return attention


def reference(attention: CausalSelfAttention, x: torch.Tensor, positions: torch.Tensor, rope: RotaryPositions,
              window: int | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q, k of HD channels per head, v of VD, v times the scale; softmax(q k^T / sqrt(HD)) v per head, the H * VD
    channels projected out (a window keeps the latest ``window`` keys, the query included; a sink joins the sum)."""
    B, T, _ = x.shape
    vd = attention.v_head_dim
    qkv = x @ attention.qkv.weight.T + (attention.qkv.bias if attention.qkv.bias is not None else 0)
    q, k, v = qkv.split((H * HD, KV * HD, KV * vd), dim=-1)
    q = q.view(B, T, H, HD).transpose(1, 2)
    k = k.view(B, T, KV, HD).transpose(1, 2)
    v = v.view(B, T, KV, vd).transpose(1, 2) * SCALE
    state = rope.prepare(positions)
    q, k = rope.rotate(q, state), rope.rotate(k, state)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)  # each query head's kv head
    scores = q @ k.transpose(-1, -2) * HD ** -0.5  # (B, H, T, T)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    hidden = (j > i) | ((i - j >= window) if window is not None else torch.zeros(T, T, dtype=torch.bool))
    scores = scores.masked_fill(hidden, float("-inf"))
    if sinks is not None:
        scores = torch.cat([scores, sinks[None, :, None, None].expand(B, H, T, 1)], dim=-1)
    weights = torch.softmax(scores, dim=-1)[..., :T]
    y = (weights @ v).transpose(1, 2).reshape(B, T, H * vd)  # (B, T, H * vd)
    return y @ attention.out.weight.T


@pytest.mark.parametrize("backend", ["auto", "sdpa", "eager"])
@pytest.mark.parametrize("v_head_dim", [10, 4])  # wider and narrower than the query/key heads
def test_value_heads_formula(backend: str, v_head_dim: int) -> None:
    attention = make(v_head_dim=v_head_dim, backend=backend)
    rope = RotaryPositions(head_dim=HD, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    got = attention(x, context(positions, rope, plain_causal=True))
    torch.testing.assert_close(got, reference(attention, x, positions, rope))


@pytest.mark.parametrize("backend", ["auto", "sdpa", "eager"])
def test_with_window_and_sinks(backend: str) -> None:
    attention = make(window=3, sinks=True, backend=backend)
    rope = RotaryPositions(head_dim=HD, context_length=16)
    x = torch.randn(2, 8, D, dtype=torch.float64)
    positions = causal_positions(2, 8)
    got = attention(x, context(positions, rope))
    torch.testing.assert_close(got, reference(attention, x, positions, rope, window=3, sinks=attention.sinks))


def test_the_scale_is_applied() -> None:
    attention = make()
    rope = RotaryPositions(head_dim=HD, context_length=16)
    x = torch.randn(1, 5, D, dtype=torch.float64)
    positions = causal_positions(1, 5)
    scaled = attention(x, context(positions, rope, plain_causal=True))
    attention.value_scale = 1.0
    # Linear in the values: without the scale the output is scaled back by 1 / SCALE.
    torch.testing.assert_close(attention(x, context(positions, rope, plain_causal=True)) * SCALE, scaled)


def test_the_cache_keeps_values_of_their_own_width() -> None:
    attention = make(window=4)
    assert cache_slots_of(attention) == CacheSlots(key_heads=KV, key_dim=HD, value_heads=KV, value_dim=VD)
    rope = RotaryPositions(head_dim=HD, context_length=16)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    cache = ListCache()
    steps = [attention(x[:, :5], context(causal_positions(2, 5), rope, cache=cache))]
    steps += [attention(x[:, t:t + 1], context(torch.full((2, 1), t), rope, cache=cache)) for t in range(5, 9)]
    key, value, _ = cache.layers[0]
    assert key.shape == (2, KV, 9, HD) and value.shape == (2, KV, 9, VD)
    whole = attention(x, context(causal_positions(2, 9), rope))
    torch.testing.assert_close(torch.cat(steps, 1), whole)


def spec() -> dict:
    return tiny_spec_over_vocab(positional={"kind": "rope", "fraction": 0.5}, block={"mixer": {
        "kind": "attention", "n_heads": H, "n_kv_heads": KV, "head_dim": 8, "v_head_dim": 12, "value_scale": SCALE,
        "window": 4, "sinks": True, "output_gate": True, "qkv_bias": True}})


def test_sized_matches_the_built_model_and_generation_uses_the_cache() -> None:
    model = specformer.build(spec(), seed=0, dtype=torch.float64).eval()
    attention = model.blocks[0].mixer
    mixer = {k: v for k, v in spec()["model"]["block"]["mixer"].items() if k != "kind"}
    sized = CausalSelfAttentionParams(**mixer).sized(d_model=model.d_model)
    assert sized.parameters == sum(p.numel() for p in attention.parameters())
    assert sized.cache_slots == cache_slots_of(attention) == CacheSlots(key_heads=KV, key_dim=8, value_heads=KV,
                                                                        value_dim=12)
    assert (attention.gate.out_features, attention.out.in_features) == (H * 12, H * 12)
    # The static cache of the generate plugin, sized from the model, prefilled then fed a token at a time (its ring
    # of 4 slots shorter than the 11 tokens), gives the logits of one forward over all of them.
    ids = torch.randint(0, model.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        decoded, _ = cached_logits(model, ids, prompt=5)
        torch.testing.assert_close(decoded, model(ids), rtol=1e-9, atol=1e-9)


def test_tensor_parallel_shares_add_up_to_the_whole() -> None:
    attention = make(qkv_bias=True)
    styles = styles_from_plan(attention, plan_of(attention), 2)
    assert isinstance(styles["qkv"], FusedColwiseParallel) and styles["qkv"].parts == (H * HD, KV * HD, KV * VD)
    rope = RotaryPositions(head_dim=HD, context_length=16)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    positions = causal_positions(2, 6)
    whole = attention(x, context(positions, rope, plain_causal=True))
    total = torch.zeros_like(whole)
    q_w, k_w, v_w = attention.qkv.weight.split((H * HD, KV * HD, KV * VD))
    q_b, k_b, v_b = attention.qkv.bias.split((H * HD, KV * HD, KV * VD))
    for rank in range(2):  # each rank: its half of the query heads, key and value heads, and output columns
        share = copy.deepcopy(attention)

        class Group:
            def size(self) -> int:
                return 2

        share.take_tensor_parallel_share(Group())
        assert share.cache_slots == CacheSlots(key_heads=1, key_dim=HD, value_heads=1, value_dim=VD)

        def half(t: torch.Tensor) -> torch.Tensor:
            return t.chunk(2)[rank]

        share.qkv.weight = torch.nn.Parameter(torch.cat([half(q_w), half(k_w), half(v_w)]))
        share.qkv.bias = torch.nn.Parameter(torch.cat([half(q_b), half(k_b), half(v_b)]))
        share.out.weight = torch.nn.Parameter(attention.out.weight.chunk(2, dim=1)[rank])
        total += share(x, context(positions, rope, plain_causal=True))
    torch.testing.assert_close(total, whole)


@pytest.mark.parametrize(("extra", "name"), [({"k_eq_v": True}, "k_eq_v"), ({"kv_from": 0}, "kv_from"),
                                              ({"differential": True}, "differential")])
def test_combinations_that_cannot_hold_are_refused(extra: dict, name: str) -> None:
    with pytest.raises(ValidationError, match=f"v_head_dim .* does not combine with {name}"):
        CausalSelfAttentionParams(n_heads=4, n_kv_heads=2, v_head_dim=8, **extra)


def test_defaults_change_nothing_and_show_in_the_repr() -> None:
    plain = CausalSelfAttention(CausalSelfAttentionParams(n_heads=4), d_model=D)
    assert plain.v_head_dim == plain.head_dim and not hasattr(plain, "cache_slots")
    assert "v_head_dim" not in plain.extra_repr() and "value_scale" not in plain.extra_repr()
    assert f"v_head_dim={VD}, value_scale={SCALE}" in make().extra_repr()
