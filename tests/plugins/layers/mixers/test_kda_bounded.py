"""KDA's bounded forgetting and full-rank gates (Ling 3's linear attention, ``decay_bound``, ``*_rank: full``).

The layer is checked against the recurrence written out below token by token, against
transformers' BailingHybridDeltaAttention on the same weights (its chunked form, and its
recurrent form through its cache), and its log decay is checked to stay within the bound.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import specformer
from specformer.errors import SpecError
from specformer.model.context import ForwardContext
from specformer_generate import StaticKVCache
from specformer_generate.cache import StateShape
from specformer_layers.mixers.kda import KimiDeltaAttention
from specformer_layers.mixers.kda_params import KimiDeltaAttentionParams

from fixtures.tiny import tiny_spec

D_MODEL = 24
BOUND = -5.0


def bounded_layer(*, heads: int = 3, head_dim: int = 6, value_head_dim: int | None = None, kernel: int = 3,
                  chunk: int = 4, seed: int = 0) -> KimiDeltaAttention:
    params = KimiDeltaAttentionParams(n_heads=heads, head_dim=head_dim, value_head_dim=value_head_dim,
                                      conv_kernel=kernel, decay_rank="full", gate_rank="full", decay_bound=BOUND,
                                      norm_eps=1e-5, chunk=chunk)
    torch.manual_seed(seed)
    layer = KimiDeltaAttention(params, d_model=D_MODEL).double()
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return layer.eval()


def reference(layer: KimiDeltaAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's output on ``x`` ``(B, T, D)`` from a zero state, one token at a time."""
    B, T, _ = x.shape
    H, dk, dv, K = layer.n_heads, layer.head_dim, layer.value_head_dim, layer.conv_kernel
    projected = x @ layer.qkv.weight.T  # (B, T, C)
    padded = F.pad(projected, (0, 0, K - 1, 0))  # K-1 zeros before the first token
    outputs = []
    S = torch.zeros(B, H, dk, dv, dtype=x.dtype)
    for t in range(T):
        # The short convolution: tap j reads the input K-1-j tokens back; then SiLU.
        mixed = F.silu(sum(padded[:, t + j] * layer.conv_weight[:, j] for j in range(K)))
        q, k, v = mixed.split((H * dk, H * dk, H * dv), dim=-1)
        q = q.view(B, H, dk) / torch.sqrt((q.view(B, H, dk) ** 2).sum(-1, keepdim=True) + 1e-6)
        k = k.view(B, H, dk) / torch.sqrt((k.view(B, H, dk) ** 2).sum(-1, keepdim=True) + 1e-6)
        q = q / dk**0.5
        v = v.view(B, H, dv)
        # The bounded forget gate: BOUND * sigmoid(exp(A_log) * (f x + dt_bias)), per key channel.
        raw = (x[:, t] @ layer.f.weight.T + layer.dt_bias).view(B, H, dk)
        log_decay = BOUND * torch.sigmoid(layer.A_log.exp()[None, :, None] * raw)
        beta = torch.sigmoid(x[:, t] @ layer.b.weight.T)  # (B, H)
        # Forget per key channel (a row of S), then the delta rule's write, then the query's read.
        S = S * log_decay.exp()[..., None]
        predicted = torch.einsum("bhk,bhkv->bhv", k, S)
        S = S + torch.einsum("bhk,bhv->bhkv", k, beta[..., None] * (v - predicted))
        o = torch.einsum("bhk,bhkv->bhv", q, S)
        # Each head's output: RMSNorm (shared weight) times sigmoid of the full-rank gate g x.
        gate = (x[:, t] @ layer.g.weight.T).view(B, H, dv)
        normed = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * layer.norm.weight
        outputs.append((normed * torch.sigmoid(gate)).reshape(B, H * dv) @ layer.out.weight.T)
    return torch.stack(outputs, dim=1)


def plain(batch: int, length: int) -> ForwardContext:
    return ForwardContext(positions=torch.arange(length).expand(batch, length), positional=None)


@pytest.mark.parametrize(("heads", "head_dim", "value_head_dim", "kernel", "chunk"),
                         [(3, 6, None, 3, 4), (2, 8, 5, 4, 64)])
def test_matches_the_recurrence_written_out(heads: int, head_dim: int, value_head_dim: int | None, kernel: int,
                                            chunk: int) -> None:
    layer = bounded_layer(heads=heads, head_dim=head_dim, value_head_dim=value_head_dim, kernel=kernel, chunk=chunk)
    x = torch.randn(2, 11, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cache = StaticKVCache(layers=(), states=[StateShape.of(layer)], batch_size=2, capacity=11, dtype=torch.float64)
    with torch.no_grad():
        expected = reference(layer, x)
        chunked = layer(x, plain(2, 11))
        stepped = torch.cat([layer(x[:, t : t + 1], ForwardContext(positions=torch.full((2, 1), t), positional=None,
                                                                  cache=cache)) for t in range(11)], dim=1)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(chunked, expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(stepped, expected, rtol=1e-9, atol=1e-9)


def test_the_log_decay_stays_within_the_bound() -> None:
    """However large the gate's input, each channel forgets at most exp(BOUND) per token and at least nothing."""
    layer = bounded_layer()
    x = 1e4 * torch.randn(3, 7, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    log_decay = layer._log_decay(x, torch.float64)
    assert log_decay.min() >= BOUND and log_decay.max() <= 0
    assert log_decay.min() < BOUND + 0.1 and log_decay.max() > -0.1  # both ends reached: the bound is what holds it
    unbounded = KimiDeltaAttention(KimiDeltaAttentionParams(n_heads=3, head_dim=6, conv_kernel=3, decay_rank="full",
                                                            gate_rank="full"),
                                   d_model=D_MODEL).double()
    unbounded.load_state_dict(layer.state_dict())
    assert unbounded._log_decay(x, torch.float64).min() < 10 * BOUND  # the softplus gate has no floor


def hf_layer(*, heads: int, head_dim: int, kernel: int, safe_gate: bool = True) -> Any:
    from transformers import BailingHybridConfig
    from transformers.models.bailing_hybrid.modeling_bailing_hybrid import BailingHybridDeltaAttention

    torch.manual_seed(0)
    layer = BailingHybridDeltaAttention(_hf_config(heads=heads, head_dim=head_dim, kernel=kernel,
                                                   safe_gate=safe_gate), 0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return layer.eval()


def _hf_config(*, heads: int, head_dim: int, kernel: int, safe_gate: bool = True) -> Any:
    from transformers import BailingHybridConfig

    return BailingHybridConfig(hidden_size=D_MODEL, num_hidden_layers=1, num_attention_heads=heads,
                               num_key_value_heads=heads, head_dim=head_dim, short_conv_kernel_size=kernel,
                               kda_safe_gate=safe_gate, kda_lower_bound=BOUND, rms_norm_eps=1e-5,
                               layer_types=["linear_attention"], mlp_layer_types=["dense"])


def ours_from(hf: Any, *, chunk: int, safe_gate: bool = True) -> KimiDeltaAttention:
    params = KimiDeltaAttentionParams(n_heads=hf.num_heads, head_dim=hf.head_dim, conv_kernel=hf.conv_kernel_size,
                                      decay_rank="full", gate_rank="full", decay_bound=BOUND if safe_gate else None,
                                      norm_eps=1e-5, chunk=chunk)
    ours = KimiDeltaAttention(params, d_model=D_MODEL)
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        ours.conv_weight.copy_(hf.conv1d.weight.squeeze(1))
        ours.f.weight.copy_(hf.forget_gate.f_proj.weight)
        ours.A_log.copy_(hf.forget_gate.A_log)
        ours.dt_bias.copy_(hf.forget_gate.dt_bias)
        for mine, theirs in ((ours.b, hf.b_proj), (ours.g, hf.g_proj), (ours.out, hf.o_proj)):
            mine.weight.copy_(theirs.weight)
        ours.norm.weight.copy_(hf.o_norm.weight)
    return ours.eval()


@pytest.mark.parametrize(("heads", "head_dim", "kernel", "chunk", "safe_gate"),
                         [(3, 8, 3, 4, True), (2, 12, 4, 64, True), (3, 8, 4, 5, False)])
def test_matches_transformers_bailing_hybrid_delta_attention(heads: int, head_dim: int, kernel: int, chunk: int,
                                                            safe_gate: bool) -> None:
    hf = hf_layer(heads=heads, head_dim=head_dim, kernel=kernel, safe_gate=safe_gate)
    ours = ours_from(hf, chunk=chunk, safe_gate=safe_gate)
    x = torch.randn(2, 13, D_MODEL, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = hf(x)
        got = ours(x, plain(2, 13))
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_decoding_through_transformers_cache_matches_ours() -> None:
    from transformers import DynamicCache

    hf = hf_layer(heads=2, head_dim=8, kernel=4)
    ours = ours_from(hf, chunk=4)
    x = torch.randn(1, 9, D_MODEL, generator=torch.Generator().manual_seed(4))
    hf_cache = DynamicCache(config=_hf_config(heads=2, head_dim=8, kernel=4))
    cache = StaticKVCache(layers=(), states=[StateShape.of(ours)], batch_size=1, capacity=9)
    with torch.no_grad():
        for start, stop in ((0, 6), (6, 7), (7, 8), (8, 9)):
            expected = hf(x[:, start:stop], cache=hf_cache)
            ctx = ForwardContext(positions=torch.arange(start, stop)[None], positional=None, cache=cache)
            torch.testing.assert_close(ours(x[:, start:stop], ctx), expected, rtol=1e-5, atol=1e-5)


def test_full_projections_are_one_linear_each_and_sized_counts_them() -> None:
    params = KimiDeltaAttentionParams(n_heads=3, head_dim=6, value_head_dim=4, decay_rank="full", gate_rank="full",
                                      decay_bound=BOUND)
    layer = KimiDeltaAttention(params, d_model=D_MODEL)
    assert layer.f.weight.shape == (18, D_MODEL) and layer.g.weight.shape == (12, D_MODEL)
    assert not any(hasattr(layer, name) for name in ("f_a", "f_b", "g_a", "g_b"))
    for p in (params, params.model_copy(update={"decay_rank": 5}), params.model_copy(update={"gate_rank": 3})):
        built = KimiDeltaAttention(p, d_model=D_MODEL)
        assert p.sized(d_model=D_MODEL).parameters == sum(t.numel() for t in built.parameters())


@pytest.mark.parametrize(("change", "says"), [
    ({"decay_bound": 1.0}, "less than 0"),
    ({"decay_rank": "half"}, "full"),
])
def test_bad_params_are_one_clear_line(change: dict[str, Any], says: str) -> None:
    spec = tiny_spec(n_layers=1, block={"mixer": {"kind": "kda", "n_heads": 2, **change}})
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    assert len(info.value.problems) == 1, info.value.problems
    assert says in info.value.problems[0].message, str(info.value.problems[0])
