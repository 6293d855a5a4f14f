"""The attention's output gate: sigmoid(x W_g + b_g) times the attention output, before the output projection."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.positional.rope import RotaryPositions

from ..support import ListCache, causal_positions, context, tiny_spec_over_vocab
from .test_causal import D, make, naive


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_gate_formula(backend: str, bias: bool) -> None:
    gated = make(n_kv_heads=2, output_gate=True, qkv_bias=bias, out_bias=bias, backend=backend)
    assert (gated.gate.bias is not None) == bias
    # The same attention without gate and with an identity output projection gives the
    # ungated heads' output (B, T, H*hd), which the formula then gates and projects.
    heads = make(n_kv_heads=2, qkv_bias=bias)
    heads.qkv.load_state_dict(gated.qkv.state_dict())
    heads.out.weight.data = torch.eye(D, dtype=torch.float64)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    attended = naive(heads, x, positions, rope)
    gate = torch.sigmoid(x @ gated.gate.weight.T + (gated.gate.bias if bias else 0))
    expected = (gate * attended) @ gated.out.weight.T + (gated.out.bias if bias else 0)
    torch.testing.assert_close(gated(x, context(positions, rope, plain_causal=True)), expected)


def test_gate_is_off_by_default_and_sized_by_the_heads() -> None:
    assert make().gate is None
    gated = CausalSelfAttention(CausalSelfAttentionParams(n_heads=4, n_kv_heads=1, head_dim=10, output_gate=True),
                                d_model=D)
    assert (gated.gate.in_features, gated.gate.out_features) == (D, 40)
    assert "output_gate=True" in gated.extra_repr()


def test_init_weights_covers_the_gate() -> None:
    gated = make(output_gate=True, qkv_bias=True)
    gated.init_weights(std=0.02, residual_std=0.01)
    assert 0.01 < gated.gate.weight.std().item() < 0.03
    assert torch.all(gated.gate.bias == 0)


def qwen_next_like_spec() -> dict:
    """Qwen3-Next's full-attention layer in small: gate, (1 + w) q/k RMSNorm per head, a quarter of channels rotating."""
    return tiny_spec_over_vocab(positional={"kind": "rope", "fraction": 0.25},
                                block={"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                                          "output_gate": True, "qk_norm": {"kind": "rmsnorm", "offset": 1.0}}})


def test_partial_rotary_with_gate_and_offset_norm() -> None:
    model = specformer.build(qwen_next_like_spec(), seed=0, dtype=torch.float64).eval()
    attention = model.blocks[0].mixer
    assert attention.gate is not None and attention.q_norm.offset == 1.0
    assert model.positional.rotary_dim == 4  # 0.25 of head_dim 16


def test_cached_matches_uncached() -> None:
    model = specformer.build(qwen_next_like_spec(), seed=0, dtype=torch.float64).eval()
    for p in model.parameters():  # away from the init's unit norms and zero biases
        p.data.add_(torch.randn_like(p) * 0.1)
    x = torch.randint(0, 61, (2, 11))
    cache = ListCache()
    steps = [model(x[:, :4], positions=causal_positions(2, 4), cache=cache)]
    steps += [model(x[:, t:t + 1], positions=torch.full((2, 1), t), cache=cache) for t in range(4, 11)]
    torch.testing.assert_close(torch.cat(steps, 1), model(x))


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_head_gate_formula(backend: str) -> None:
    """output_gate_scope head: out(concat_h(sigmoid(x . g_h) * head_h)), g_h one row of a bias-free projection (LFM3)."""
    gated = make(n_kv_heads=2, output_gate=True, output_gate_scope="head", qkv_bias=True, out_bias=True,
                 backend=backend)
    assert gated.gate.bias is None and gated.gate.out_features == gated.n_heads
    heads = make(n_kv_heads=2, qkv_bias=True)
    heads.qkv.load_state_dict(gated.qkv.state_dict())
    heads.out.weight.data = torch.eye(D, dtype=torch.float64)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    attended = naive(heads, x, positions, rope)  # (B, T, H*hd), head h in channels h*hd .. (h+1)*hd
    gate = torch.sigmoid(x @ gated.gate.weight.T)  # (B, T, H)
    expected = (gate.repeat_interleave(gated.head_dim, dim=-1) * attended) @ gated.out.weight.T + gated.out.bias
    torch.testing.assert_close(gated(x, context(positions, rope, plain_causal=True)), expected)


def test_head_gate_is_sized_by_the_heads() -> None:
    params = CausalSelfAttentionParams(n_heads=4, n_kv_heads=1, head_dim=10, output_gate=True,
                                       output_gate_scope="head", qkv_bias=True)
    gated = CausalSelfAttention(params, d_model=D)
    assert (gated.gate.in_features, gated.gate.out_features) == (D, 4)
    assert "output_gate=head" in gated.extra_repr()
    assert params.sized(d_model=D).parameters == sum(p.numel() for p in gated.parameters())


@pytest.mark.parametrize("scope", ["channel", "head"])
def test_softplus_gate_formula(scope: str) -> None:
    """output_gate_activation softplus (Laguna): softplus(x W_g) per channel, or per head over its hd channels."""
    gated = make(n_kv_heads=2, output_gate=True, output_gate_scope=scope, output_gate_activation="softplus")
    heads = make(n_kv_heads=2)
    heads.qkv.load_state_dict(gated.qkv.state_dict())
    heads.out.weight.data = torch.eye(D, dtype=torch.float64)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    attended = naive(heads, x, positions, rope)  # (B, T, H*hd)
    gate = torch.log1p(torch.exp(x @ gated.gate.weight.T))  # softplus written out
    if scope == "head":
        gate = gate.repeat_interleave(6, dim=-1)  # each head's gate over its 6 channels
    expected = (gate * attended) @ gated.out.weight.T
    got = gated(x, context(positions, rope, plain_causal=True))
    torch.testing.assert_close(got, expected)
    assert "output_gate_activation=softplus" in gated.extra_repr()
    gated.gate_activation = "sigmoid"  # the activation is applied, not only declared
    assert not torch.allclose(gated(x, context(positions, rope, plain_causal=True)), got)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_per_head_gate_bias_formula(backend: str) -> None:
    """output_gate_bias head (Beam): sigmoid(x W_g + b_head(c)) per channel c, W_g bias-free even with qkv_bias."""
    gated = make(n_kv_heads=2, output_gate=True, output_gate_bias="head", qkv_bias=True, backend=backend)
    assert gated.gate.bias is None and gated.gate_head_bias.shape == (4,)
    heads = make(n_kv_heads=2, qkv_bias=True)
    heads.qkv.load_state_dict(gated.qkv.state_dict())
    heads.out.weight.data = torch.eye(D, dtype=torch.float64)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    attended = naive(heads, x, positions, rope)  # (B, T, H*hd), head h in channels h*6 .. (h+1)*6
    bias = torch.stack([gated.gate_head_bias[c // 6] for c in range(24)])  # channel c belongs to head c // 6
    gate = torch.sigmoid(x @ gated.gate.weight.T + bias)
    torch.testing.assert_close(gated(x, context(positions, rope, plain_causal=True)), (gate * attended) @ gated.out.weight.T)
    assert "output_gate_bias=head" in gated.extra_repr()


def test_per_head_gate_bias_is_sized_and_initialised() -> None:
    params = CausalSelfAttentionParams(n_heads=4, n_kv_heads=1, head_dim=10, output_gate=True, output_gate_bias="head")
    gated = CausalSelfAttention(params, d_model=D)
    assert params.sized(d_model=D).parameters == sum(p.numel() for p in gated.parameters())
    gated.gate_head_bias.data.fill_(1.0)
    gated.init_weights(std=0.02, residual_std=0.01)
    assert torch.all(gated.gate_head_bias == 0)
    for bad in ({"output_gate": False}, {"output_gate": True, "output_gate_scope": "head"}):
        with pytest.raises(Exception, match="output_gate_bias head .* needs output_gate true with output_gate_scope channel"):
            CausalSelfAttentionParams(n_heads=4, output_gate_bias="head", **bad)
