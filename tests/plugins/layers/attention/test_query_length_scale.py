"""Beam's query length scale: queries multiplied by ``(1 + (p + 1) / base) ^ exponent`` of their position.

The multiplier is checked against the formula written out here, the layer against the same
layer without it fed scaled queries, and a model with a NoPE layer carrying the scale
through the cache (decoding, left-padded prompts): the scale reads absolute positions, so
each decode step must get the positions a full forward would.
"""

from __future__ import annotations

import pytest
import torch

import specformer
from fixtures.caching import cached_logits
from fixtures.tiny import tiny_spec
from specformer_layers.attention.causal import CausalSelfAttention, query_length_scale
from specformer_layers.attention.params import CausalSelfAttentionParams

from ..support import causal_positions, context

BASE, EXPONENT = 3.0, 0.7  # small base, large exponent: the multiplier moves within a test's few positions


def multiplier(position: int, base: float, exponent: float) -> float:
    """``(1 + (position + 1) / base) ** exponent`` (Beam: base 2048, exponent 0.1)."""
    return (1.0 + (position + 1) / base) ** exponent


def test_the_multiplier_is_the_formula() -> None:
    positions = torch.tensor([[0, 1, 2, 5, 100, 2047, 2048, 70000]])
    for base, exponent in ((BASE, EXPONENT), (2048.0, 0.1)):
        got = query_length_scale(positions, base, exponent)
        want = [multiplier(p, base, exponent) for p in positions[0].tolist()]
        torch.testing.assert_close(got[0].double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0)
    assert query_length_scale(torch.tensor([[-1, -4]]), BASE, EXPONENT).tolist() == [[1.0, 1.0]]  # padding


def test_only_queries_are_scaled() -> None:
    """The layer with the scale equals the layer without, fed queries multiplied by the formula."""
    torch.manual_seed(0)
    scaled = CausalSelfAttention(CausalSelfAttentionParams(n_heads=2, query_length_scale=True,
                                                           query_length_scale_base=BASE,
                                                           query_length_scale_exponent=EXPONENT, backend="eager"),
                                 d_model=8).double()
    plain = CausalSelfAttention(CausalSelfAttentionParams(n_heads=2, backend="eager"), d_model=8).double()
    plain.load_state_dict(scaled.state_dict())
    x = torch.randn(1, 9, 8, dtype=torch.float64)
    scale = torch.tensor([multiplier(p, BASE, EXPONENT) for p in range(9)], dtype=torch.float64)
    with torch.no_grad():
        q_rows = plain.qkv.weight[:8].clone()
        got = scaled(x, context(causal_positions(1, 9)))
        want = []
        for t in range(9):  # a score is linear in its query: scale the query rows, one layer per position
            plain.qkv.weight[:8] = q_rows * scale[t]
            want.append(plain(x[:, : t + 1], context(causal_positions(1, t + 1)))[:, t])
    torch.testing.assert_close(got, torch.stack(want, 1), rtol=1e-6, atol=1e-7)  # the multiplier is float32


def _beam_like(seed: int) -> torch.nn.Module:
    """A rotary windowed layer, then a NoPE layer with the query length scale."""
    spec = tiny_spec(
        block={"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": 3}},
        layers=[{"select": 1, "positional": "none",
                 "mixer": {"window": None, "query_length_scale": True, "query_length_scale_base": BASE,
                           "query_length_scale_exponent": EXPONENT}}],
    )
    return specformer.build(spec, seed=seed).double().eval()


@torch.no_grad()
def test_decoding_through_the_cache_is_recompute() -> None:
    model = _beam_like(0)
    assert "query_length_scale=(base=3.0, exponent=0.7)" in repr(model.blocks[1].mixer)
    ids = torch.randint(0, model.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    decoded, _ = cached_logits(model, ids, prompt=5)
    torch.testing.assert_close(decoded, model(ids), rtol=1e-9, atol=1e-9)


@torch.no_grad()
def test_left_padded_ragged_prompts_are_as_alone() -> None:
    from specformer_generate import generate

    model = _beam_like(1)
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6], [5, 3, 5]]
    assert generate(model, prompts, max_new_tokens=5) == [generate(model, [p], max_new_tokens=5)[0] for p in prompts]


def test_without_it_the_layer_does_not_scale() -> None:
    """The scale changes the output (the reference test above could not pass by a no-op)."""
    torch.manual_seed(0)
    scaled = CausalSelfAttention(CausalSelfAttentionParams(n_heads=2, query_length_scale=True,
                                                           query_length_scale_base=BASE), d_model=8)
    plain = CausalSelfAttention(CausalSelfAttentionParams(n_heads=2), d_model=8)
    plain.load_state_dict(scaled.state_dict())
    x = torch.randn(1, 6, 8)
    with torch.no_grad():
        assert not torch.allclose(scaled(x, context(causal_positions(1, 6))), plain(x, context(causal_positions(1, 6))))


@pytest.mark.parametrize("field", ["query_length_scale_base", "query_length_scale_exponent"])
def test_non_positive_settings_are_refused(field: str) -> None:
    with pytest.raises(Exception, match=field):
        CausalSelfAttentionParams(n_heads=2, query_length_scale=True, **{field: 0})
