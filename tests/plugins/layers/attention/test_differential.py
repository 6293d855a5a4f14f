"""differential: pairs of heads whose second softmax, scaled by a learned lambda, is subtracted (DiffLlama)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

import specformer
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.positional.rope import RotaryPositions

from ..support import ListCache, causal_positions, context, tiny_spec_over_vocab
from .test_causal import D

EPS = 1e-5


def make(layer_index: int = 0, **kwargs: object) -> CausalSelfAttention:
    params = CausalSelfAttentionParams(**{"n_heads": 4, "n_kv_heads": 2, "differential": True, **kwargs})
    attention = CausalSelfAttention(params, d_model=D, layer_index=layer_index).double()
    for p in attention.parameters():
        p.data.normal_(0, 0.3)
    return attention


def reference(attention: CausalSelfAttention, x: torch.Tensor, positions: torch.Tensor, rope: RotaryPositions,
              layer_index: int) -> torch.Tensor:
    """Differential attention written out pair by pair (transformers' DiffLlama arrangement).

    Pair j (of H/2) has queries j and j + H/2, keys g and g + KV/2 (g = j's key head), and a value of 2 hd
    channels: value heads g and g + KV/2 side by side. Its output is
    (1 - l0) * rms((softmax(q1 k1) - lambda softmax(q2 k2)) V), lambda = e^(lq1.lk1) - e^(lq2.lk2) + l0,
    l0 = 0.8 - 0.6 e^(-0.3 layer).
    """
    B, T, _ = x.shape
    H, KV, hd = attention.n_heads, attention.n_kv_heads, attention.head_dim
    q, k, v = (x @ attention.qkv.weight.T).split((H * hd, KV * hd, KV * hd), dim=-1)
    q = q.view(B, T, H, hd).transpose(1, 2)
    k = k.view(B, T, KV, hd).transpose(1, 2)
    v = v.view(B, T, KV, hd).transpose(1, 2)
    state = rope.prepare(positions)
    q, k = rope.rotate(q, state), rope.rotate(k, state)
    d = attention.differential
    l0 = 0.8 - 0.6 * math.exp(-0.3 * layer_index)
    lam = torch.exp(d.lambda_q1 @ d.lambda_k1) - torch.exp(d.lambda_q2 @ d.lambda_k2) + l0
    future = torch.ones(T, T, dtype=torch.bool).triu(1)

    def softmax(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        scores = query @ key.transpose(-1, -2) / math.sqrt(hd)
        return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)

    pairs = []
    for j in range(H // 2):
        g = j // (H // KV)
        value = torch.cat([v[:, g], v[:, g + KV // 2]], dim=-1)  # (B, T, 2hd)
        mixed = (softmax(q[:, j], k[:, g]) - lam * softmax(q[:, j + H // 2], k[:, g + KV // 2])) @ value
        normed = mixed / torch.sqrt(mixed.pow(2).mean(-1, keepdim=True) + EPS)
        if d.norm.weight is not None:
            normed = normed * d.norm.weight
        pairs.append((1 - l0) * normed)
    return torch.cat(pairs, dim=-1) @ attention.out.weight.T  # (B, T, H/2 * 2hd) -> (B, T, D)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize(("n_heads", "n_kv_heads", "layer_index"), [(4, 2, 0), (4, 4, 3), (8, 2, 5), (2, 2, 1)])
def test_differential_formula(backend: str, n_heads: int, n_kv_heads: int, layer_index: int) -> None:
    attention = make(layer_index, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=6, backend=backend)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    got = attention(x, context(positions, rope, plain_causal=True))
    torch.testing.assert_close(got, reference(attention, x, positions, rope, layer_index))


def test_a_norm_with_a_weight_and_the_lambda_matter() -> None:
    attention = make(2, differential_norm={"kind": "rmsnorm", "eps": EPS})
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    positions = causal_positions(2, 5)
    got = attention(x, context(positions, rope, plain_causal=True))
    torch.testing.assert_close(got, reference(attention, x, positions, rope, 2))
    # Another lambda gives another output: the second map is subtracted, not only computed.
    with torch.no_grad():
        attention.differential.lambda_q2.mul_(3.0)
    assert not torch.allclose(attention(x, context(positions, rope, plain_causal=True)), got)


def test_lambda_init_by_depth() -> None:
    for layer, expected in ((0, 0.2), (1, 0.8 - 0.6 * math.exp(-0.3)), (10, 0.8 - 0.6 * math.exp(-3.0))):
        assert make(layer).differential.lambda_init == pytest.approx(expected)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_cached_decode_and_left_padding_match_one_forward(backend: str) -> None:
    attention = make(4, backend=backend)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    cache = ListCache()
    steps = [attention(x[:, :5], context(causal_positions(2, 5), rope, cache=cache))]
    steps += [attention(x[:, t:t + 1], context(torch.full((2, 1), t), rope, cache=cache)) for t in range(5, 9)]
    whole = attention(x, context(causal_positions(2, 9), rope, plain_causal=True))
    torch.testing.assert_close(torch.cat(steps, 1), whole)
    # Row 0 left-padded by two: its real tokens see what an unpadded forward of them sees.
    positions = torch.tensor([[-1, -1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    padded = attention(x[:, :6], context(positions, rope))
    alone = attention(x[:1, 2:6], context(causal_positions(1, 4), rope, plain_causal=True))
    torch.testing.assert_close(padded[:1, 2:], alone)


def test_decoder_cache_matches_one_forward() -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "differential": True}
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    x = torch.randint(0, 61, (2, 10))
    cache = ListCache()
    steps = [model(x[:, :4], positions=causal_positions(2, 4), cache=cache)]
    steps += [model(x[:, t:t + 1], positions=torch.full((2, 1), t), cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), model(x))
    lambdas = [block.mixer.differential.lambda_q1 for block in model.blocks]
    assert all(0 < float(vector.detach().std()) < 1 for vector in lambdas)  # initialised, not left at zero


def test_sized_matches_the_built_layer_and_shows_in_the_repr() -> None:
    for norm in ({"kind": "rmsnorm", "weight": False}, "rmsnorm"):
        params = CausalSelfAttentionParams(n_heads=4, n_kv_heads=2, differential=True, differential_norm=norm)
        built = CausalSelfAttention(params, d_model=D)
        assert params.sized(d_model=D).parameters == sum(p.numel() for p in built.parameters())
    plain = CausalSelfAttentionParams(n_heads=4, n_kv_heads=2).sized(d_model=D).parameters
    assert CausalSelfAttentionParams(n_heads=4, n_kv_heads=2, differential=True).sized(d_model=D).parameters == \
        plain + 4 * 6  # the four lambda vectors of head_dim; the default norm has no weight
    assert "differential=True" in make().extra_repr()


@pytest.mark.parametrize(("changes", "message"), [
    ({"n_kv_heads": 3, "n_heads": 3}, "n_kv_heads .* must be even, got 3"),
    ({"n_kv_heads": None, "n_heads": 5}, "must be even, got 5"),
    ({"dropout": 0.1}, "no dropout"),
    ({"output_gate": True}, "output_gate"),
])
def test_what_does_not_pair_is_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        CausalSelfAttentionParams(**{"n_heads": 4, "n_kv_heads": 2, "differential": True, **changes})


def test_tensor_parallel_is_refused() -> None:
    class Mesh:
        def size(self) -> int:
            return 2

    with pytest.raises(ValueError, match="differential attention"):
        make().take_tensor_parallel_share(Mesh())
