"""RoPE against an explicit rotation of channel pairs and against transformers' rotary code."""

from __future__ import annotations

import math

import pytest
import torch

import specformer
from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions, rotary_dim_of

from ..support import tiny_spec_over_vocab


def rotate_pairs_reference(x: torch.Tensor, positions: torch.Tensor, *, theta: float, rotary_dim: int,
                           interleaved: bool) -> torch.Tensor:
    """Rotate channel pair i of every head by position * theta^(-2i/rotary_dim), one 2x2 matrix at a time."""
    out = x.clone()
    half = rotary_dim // 2
    for i in range(half):
        a_idx, b_idx = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
        angle = positions.double()[:, None, :] * theta ** (-2 * i / rotary_dim)  # (B, 1, T)
        c, s = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
        a, b = x[..., a_idx], x[..., b_idx]
        out[..., a_idx] = a * c - b * s
        out[..., b_idx] = a * s + b * c
    return out


@pytest.mark.parametrize(("head_dim", "fraction", "interleaved"),
                         [(16, 1.0, False), (16, 1.0, True), (16, 0.25, False), (12, 0.5, True), (10, 1.0, False)])
def test_rotation_of_pairs(head_dim: int, fraction: float, interleaved: bool) -> None:
    rope = RotaryPositions(RotaryPositionsParams(theta=1000.0, fraction=fraction, interleaved=interleaved), head_dim=head_dim,
                           context_length=128)
    x = torch.randn(2, 3, 7, head_dim, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [9, 40, 41, 100, 2, 3, -1]])
    got = rope.rotate(x, rope.prepare(positions))
    expected = rotate_pairs_reference(x, positions, theta=1000.0, rotary_dim=rope.rotary_dim, interleaved=interleaved)
    # Angles are float32 (as every RoPE implementation computes them); the reference is float64.
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=2e-5)
    assert rope.rotary_dim == rotary_dim_of(head_dim, fraction)
    torch.testing.assert_close(got[..., rope.rotary_dim:], x[..., rope.rotary_dim:], rtol=0, atol=0)


def test_scores_depend_on_distance_only() -> None:
    rope = RotaryPositions(head_dim=8, context_length=128)
    q, k = torch.randn(1, 1, 1, 8, dtype=torch.float64), torch.randn(1, 1, 1, 8, dtype=torch.float64)

    def score(pq: int, pk: int) -> torch.Tensor:
        rq = rope.rotate(q, rope.prepare(torch.tensor([[pq]])))
        rk = rope.rotate(k, rope.prepare(torch.tensor([[pk]])))
        return (rq * rk).sum()

    torch.testing.assert_close(score(7, 3), score(104, 100), rtol=1e-5, atol=1e-5)  # float32 angles
    torch.testing.assert_close(score(3, 3), (q * k).sum())


@pytest.mark.parametrize("fraction", [1.0, 0.25])
def test_matches_transformers_half_split(fraction: float) -> None:
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    config = GPTNeoXConfig(hidden_size=64, num_attention_heads=4, max_position_embeddings=128,
                           rope_parameters={"rope_type": "default", "rope_theta": 5000.0, "partial_rotary_factor": fraction})
    rope = RotaryPositions(RotaryPositionsParams(theta=5000.0, fraction=fraction), head_dim=16, context_length=128)
    hf = GPTNeoXRotaryEmbedding(config)
    positions = torch.tensor([[0, 3, 5, 90], [1, 2, 3, 4]])
    q, k = torch.randn(2, 4, 4, 16), torch.randn(2, 4, 4, 16)
    cos, sin = hf(q, positions)
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    state = rope.prepare(positions)
    torch.testing.assert_close(rope.rotate(q, state), hq, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rope.rotate(k, state), hk, rtol=1e-5, atol=1e-5)


def test_matches_transformers_interleaved_gptj() -> None:
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

    rotary_dim = 8
    rope = RotaryPositions(RotaryPositionsParams(fraction=0.5, interleaved=True), head_dim=16, context_length=64)
    positions = torch.tensor([[0, 1, 7, 30]])
    x = torch.randn(1, 4, 3, 16)  # GPT-J's layout: (B, T, H, hd)
    table = create_sinusoidal_positions(64, rotary_dim)[positions]  # (B, T, rotary_dim)
    sin, cos = table.chunk(2, dim=-1)
    expected_rot = apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos)
    got = rope.rotate(x.transpose(1, 2), rope.prepare(positions)).transpose(1, 2)
    torch.testing.assert_close(got[..., :rotary_dim], expected_rot, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[..., rotary_dim:], x[..., rotary_dim:])


def test_frequencies_stay_float32_under_bfloat16() -> None:
    model = specformer.build(tiny_spec_over_vocab(positional={"kind": "rope", "theta": 500000.0}), seed=0,
                             dtype=torch.bfloat16)
    rope = model.positional
    assert rope.inv_freq.dtype == torch.float32
    torch.testing.assert_close(rope.inv_freq, 1.0 / 500000.0 ** (torch.arange(0, 8, 2).float() / 8), rtol=0, atol=0)
    assert not [k for k in model.state_dict() if "freq" in k], "frequencies are derived, never saved"
    # At position 5000 the angle of the fastest pair must be right to float32 precision, not bf16's.
    cos, _ = rope.prepare(torch.tensor([[5000]]))
    assert math.isclose(cos[0, 0, 0, 0].item(), math.cos(5000.0), abs_tol=1e-3)


def test_rejects_too_few_rotary_channels() -> None:
    with pytest.raises(ValueError, match="need at least 2"):
        RotaryPositions(RotaryPositionsParams(fraction=0.25), head_dim=4, context_length=8)
    with pytest.raises(specformer.SpecError, match="model.positional"):
        specformer.build(tiny_spec_over_vocab(positional={"kind": "rope", "fraction": 0.1}))


def test_scaling_is_validated_against_the_registry() -> None:
    with pytest.raises(specformer.SpecError, match="unknown rope_scaling 'lienar'.*did you mean 'linear'"):
        specformer.load_spec(tiny_spec_over_vocab(positional={"kind": "rope",
                                                              "scaling": {"kind": "lienar", "factor": 2}}))
    with pytest.raises(specformer.SpecError, match="factor"):
        specformer.load_spec(tiny_spec_over_vocab(positional={"kind": "rope", "scaling": {"kind": "linear"}}))
    spec = specformer.load_spec(tiny_spec_over_vocab(positional={"kind": "rope",
                                                                 "scaling": {"kind": "linear", "factor": 2}}))
    assert spec.to_dict()["model"]["positional"]["scaling"] == {"kind": "linear", "factor": 2.0}
