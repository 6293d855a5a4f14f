"""Llama 4's attention-temperature tuning (queries scaled by a log of their position) and its qk l2norm.

The multiplier is checked against the formula written out here, the layer against
transformers' Llama4TextAttention, and a Llama 4-shaped model (a NoPE layer with tuning, a
rotary layer with l2-normalised queries and keys) through every consumer of the cache:
decoding, left-padded ragged prompts, beams and drafts. The tuning reads absolute
positions, so each of those must hand the layer the positions a plain forward would.
"""

from __future__ import annotations

import math

import pytest
import torch

import specformer
from fixtures.recurrent import beam_search_by_recompute
from fixtures.caching import cached_logits
from fixtures.tiny import tiny_spec
from specformer_layers.attention.causal import CausalSelfAttention, query_temperature
from specformer_layers.attention.params import CausalSelfAttentionParams

from ..support import causal_positions, context

FLOOR, STRENGTH = 3, 0.5  # small enough that the multiplier changes within a test's few positions


def multiplier(position: int, floor_scale: float, attn_scale: float, offset: int = 1) -> float:
    """``1 + attn_scale * ln(1 + floor((position + offset) / floor_scale))`` (Llama 4's offset 1, arXiv:2501.19399)."""
    return 1.0 + attn_scale * math.log(1.0 + math.floor((position + offset) / floor_scale))


def test_the_multiplier_is_the_formula() -> None:
    positions = torch.tensor([[0, 1, 2, 3, 7, 8, 100, 8191, 8192, 70000]])
    for floor_scale, attn_scale in ((FLOOR, STRENGTH), (8192, 0.1)):
        got = query_temperature(positions, floor_scale, attn_scale)
        want = [multiplier(p, floor_scale, attn_scale) for p in positions[0].tolist()]
        torch.testing.assert_close(got[0].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0)
    assert query_temperature(torch.tensor([[-1, -5]]), FLOOR, STRENGTH).tolist() == [[1.0, 1.0]]  # padding


def test_offset_zero_counts_positions_from_zero() -> None:
    """Ministral 3's ``1 + beta * ln(1 + floor(position / original_max_position_embeddings))``: each step one position
    later than Llama 4's (at FLOOR, not FLOOR - 1)."""
    positions = torch.tensor([[0, 1, 2, 3, 5, 6, 8, 9, 100]])
    got = query_temperature(positions, FLOOR, STRENGTH, 0)
    want = [1.0 + STRENGTH * math.log(1.0 + math.floor(p / FLOOR)) for p in positions[0].tolist()]
    torch.testing.assert_close(got[0].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0)
    assert got[0, 2] == 1.0 and query_temperature(positions, FLOOR, STRENGTH)[0, 2] > 1.0  # position 2: only Llama 4's


@pytest.mark.parametrize("offset", [1, 0])
def test_only_queries_are_scaled(offset: int) -> None:
    """The layer with tuning equals the layer without, fed queries multiplied by the formula (either offset)."""
    torch.manual_seed(0)
    tuned = CausalSelfAttention(CausalSelfAttentionParams(n_heads=2, temperature_tuning=True, temperature_floor_scale=FLOOR,
                                                          temperature_attn_scale=STRENGTH,
                                                          temperature_position_offset=offset, backend="eager"), d_model=8)
    plain = CausalSelfAttention(CausalSelfAttentionParams(n_heads=2, backend="eager"), d_model=8)
    plain.load_state_dict(tuned.state_dict())
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    tuned, plain = tuned.double(), plain.double()
    scale = torch.tensor([multiplier(p, FLOOR, STRENGTH, offset) for p in range(9)], dtype=torch.float64)
    with torch.no_grad():
        q_rows = plain.qkv.weight[:8].clone()
        got = tuned(x, context(causal_positions(1, 9)))
        # A query's score is linear in the query: scaling its projection row-wise per position
        # is the same as scaling each position's query, done here with one layer per position.
        want = []
        for t in range(9):
            plain.qkv.weight[:8] = q_rows * scale[t]
            want.append(plain(x[:, : t + 1], context(causal_positions(1, t + 1)))[:, t])
    # the multiplier is float32 (as in transformers), the rest float64
    torch.testing.assert_close(got, torch.stack(want, 1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("nope", [True, False])
def test_matches_transformers_llama4_attention(nope: bool) -> None:
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding

    config = Llama4TextConfig(hidden_size=24, num_attention_heads=4, num_key_value_heads=2, head_dim=6,
                              num_hidden_layers=1, no_rope_layers=[0 if nope else 1], floor_scale=FLOOR,
                              attn_scale=STRENGTH, attn_temperature_tuning=True, use_qk_norm=True,
                              rms_norm_eps=1e-5, attention_chunk_size=None)
    config._attn_implementation = "eager"
    torch.manual_seed(1)
    theirs = Llama4TextAttention(config, 0).double()
    for p in theirs.parameters():
        torch.nn.init.normal_(p, std=0.3)
    positional = {"kind": "none"} if nope else {"kind": "rope", "theta": config.rope_parameters["rope_theta"], "interleaved": True}
    attention = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "head_dim": 6, "backend": "eager"}
    if nope:
        attention.update(temperature_tuning=True, temperature_floor_scale=FLOOR, temperature_attn_scale=STRENGTH)
    else:
        attention.update(qk_norm={"kind": "l2norm", "eps": 1e-5})
    model = specformer.build(tiny_spec(d_model=24, n_layers=1, positional=positional, block={"mixer": attention}))
    ours = model.blocks[0].mixer.double()
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight]))
        ours.out.weight.copy_(theirs.o_proj.weight)
    T = 12
    x = torch.randn(1, T, 24, dtype=torch.float64)
    freqs = Llama4TextRotaryEmbedding(config)(x, torch.arange(T)[None])
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    want, _ = theirs(x, freqs, mask)
    positions = torch.arange(T)[None]
    ctx = specformer.model.context.ForwardContext(positions=positions, positional=model.positional,
                                                  positional_state=model.positional.prepare(positions))
    # transformers turns rotary pairs in float32 complex numbers, whatever the dtype
    torch.testing.assert_close(ours(x, ctx), want, rtol=1e-5, atol=1e-6)


def _llama4_like(seed: int) -> torch.nn.Module:
    """A rotary layer with l2-normalised q/k and chunked attention, then a NoPE layer with temperature tuning."""
    spec = tiny_spec(
        positional={"kind": "rope", "interleaved": True},
        block={"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "chunk": 4, "qk_norm": "l2norm"}},
        layers=[{"select": 1, "positional": "none",
                 "mixer": {"chunk": None, "qk_norm": None, "temperature_tuning": True,
                               "temperature_floor_scale": FLOOR, "temperature_attn_scale": STRENGTH}}],
    )
    return specformer.build(spec, seed=seed).double().eval()


@torch.no_grad()
def test_decoding_through_the_cache_is_recompute() -> None:
    model = _llama4_like(0)
    ids = torch.randint(0, model.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    decoded, cache = cached_logits(model, ids, prompt=5)
    torch.testing.assert_close(decoded, model(ids), rtol=1e-9, atol=1e-9)
    # The chunked layer reads at most its chunk back, so it keeps a ring of 4 slots; the global one every token.
    assert cache.slot_counts() == {0: 4, 1: 11}


@torch.no_grad()
def test_left_padded_ragged_prompts_are_as_alone() -> None:
    from specformer_generate import generate

    model = _llama4_like(1)
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6], [5, 3, 5]]
    together = generate(model, prompts, max_new_tokens=6)
    assert together == [generate(model, [p], max_new_tokens=6)[0] for p in prompts]
    # and each alone is the model's own greedy continuation, recomputed from scratch
    for prompt, got in zip(prompts, together):
        ids = torch.tensor([prompt])
        for _ in range(6):
            ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], 1)
        assert got == ids[0].tolist()


@torch.no_grad()
def test_beams_and_drafts_are_recompute() -> None:
    from specformer_generate import generate

    model = _llama4_like(2)
    prompt = torch.randint(0, model.vocab_size, (1, 4), generator=torch.Generator().manual_seed(2))
    assert generate(model, prompt, max_new_tokens=4, num_beams=3)[0].tolist() == \
        beam_search_by_recompute(model, prompt, beams=3, steps=4)
    draft = _llama4_like(4)
    prompt = torch.randint(0, model.vocab_size, (2, 4), generator=torch.Generator().manual_seed(3))
    want = generate(model, prompt, max_new_tokens=9, use_cache=False)
    assert torch.equal(generate(model, prompt, max_new_tokens=9, draft=draft, draft_tokens=3), want)
