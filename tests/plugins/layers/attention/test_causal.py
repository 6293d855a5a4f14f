"""Causal self-attention against a naive masked softmax with repeated KV heads; sdpa against eager."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

import specformer
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.norms.layernorm import LayerNorm
from specformer_layers.norms.rmsnorm import RMSNorm
from specformer_layers.positional.alibi import ALiBi
from specformer_layers.positional.rope import RotaryPositions

from ..support import ListCache, causal_positions, context, tiny_spec_over_vocab

D = 24


def make(**kwargs: object) -> CausalSelfAttention:
    attention = CausalSelfAttention(CausalSelfAttentionParams(**{"n_heads": 4, **kwargs}), d_model=D).double()
    for p in attention.parameters():
        p.data.normal_(0, 0.3)
    return attention


def naive(attention: CausalSelfAttention, x: torch.Tensor, positions: torch.Tensor, positional=None,
          head_norms=None) -> torch.Tensor:
    """Each head's softmax over the keys it may see, written out; KV heads repeated for their query group.

    ``head_norms(q, k)``, when given, normalises the (B, heads, T, hd) queries and keys instead of the module's norms.
    """
    B, T, _ = x.shape
    H, KV, hd = attention.n_heads, attention.n_kv_heads, attention.head_dim
    qkv = x @ attention.qkv.weight.T + (attention.qkv.bias if attention.qkv.bias is not None else 0)
    q, k, v = qkv.split((H * hd, KV * hd, KV * hd), dim=-1)
    if attention.q_norm is not None and attention.qk_norm_scope == "all":
        q, k = attention.q_norm(q), attention.k_norm(k)
    q = q.view(B, T, H, hd).transpose(1, 2)
    k = k.view(B, T, KV, hd).transpose(1, 2)
    v = v.view(B, T, KV, hd).transpose(1, 2)
    if head_norms is not None:
        q, k = head_norms(q, k)
    elif attention.q_norm is not None and attention.qk_norm_scope in ("head", "per_head_weights"):
        q, k = attention.q_norm(q), attention.k_norm(k)
    if positional is not None:
        state = positional.prepare(positions)
        q, k = positional.rotate(q, state), positional.rotate(k, state)
    out = torch.zeros(B, H, T, hd, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            g = h // (H // KV)  # the KV head this query head reads
            for i in range(T):
                pi = positions[b, i].item()
                scores, values = [], []
                for j in range(T):
                    pj = positions[b, j].item()
                    visible = 0 <= pj <= pi and (attention.window is None or pi - pj < attention.window)
                    if pi < 0:
                        visible = True  # padding queries attend everywhere (their output is unused)
                    if not visible:
                        continue
                    s = (q[b, h, i] @ k[b, g, j]) * attention.scale
                    if attention.logit_softcap is not None:
                        s = attention.logit_softcap * torch.tanh(s / attention.logit_softcap)
                    if isinstance(positional, ALiBi):
                        s = s - positional.slopes[h].double() * (pi - pj)
                    scores.append(s)
                    values.append(v[b, g, j])
                weights = torch.softmax(torch.stack(scores), dim=0)
                out[b, h, i] = (weights[:, None] * torch.stack(values)).sum(0)
    y = out.transpose(1, 2).reshape(B, T, H * hd)
    return y @ attention.out.weight.T + (attention.out.bias if attention.out.bias is not None else 0)


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize(("n_kv_heads", "window", "head_dim"),
                         [(4, None, None), (2, None, None), (1, None, 10), (2, 3, None), (1, 1, None), (4, 2, 5)])
def test_matches_naive_attention(backend: str, n_kv_heads: int, window: int | None, head_dim: int | None) -> None:
    attention = make(n_kv_heads=n_kv_heads, window=window, head_dim=head_dim, qkv_bias=True, out_bias=True,
                     backend=backend)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    got = attention(x, context(positions, plain_causal=True))
    torch.testing.assert_close(got, naive(attention, x, positions))


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_padding_and_arbitrary_positions(backend: str) -> None:
    attention = make(n_kv_heads=2, window=4, backend=backend)
    rope = RotaryPositions(head_dim=6, context_length=32)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    positions = torch.tensor([[-1, -1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])  # left padding in row 0
    got = attention(x, context(positions, rope))
    expected = naive(attention, x, positions, rope)
    torch.testing.assert_close(got[:, 2:], expected[:, 2:])
    torch.testing.assert_close(got[1], expected[1])
    # The padded row's real tokens see exactly what an unpadded forward of them sees.
    alone = attention(x[:1, 2:], context(causal_positions(1, 4), rope, plain_causal=True))
    torch.testing.assert_close(got[:1, 2:], alone)


@pytest.mark.parametrize("scope", ["head", "all"])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_qk_norm_scopes(scope: str, norm: str) -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2,
                                           "qk_norm": norm, "qk_norm_scope": scope}
    attention = specformer.build(spec, seed=0).blocks[0].mixer.double()
    width_q, width_k = (8, 8) if scope == "head" else (32, 16)
    assert attention.q_norm.dim == width_q and attention.k_norm.dim == width_k
    assert isinstance(attention.q_norm, RMSNorm if norm == "rmsnorm" else LayerNorm)
    for p in attention.parameters():
        p.data.normal_(0, 0.3)
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    positions = causal_positions(2, 5)
    torch.testing.assert_close(attention(x, context(positions, plain_causal=True)), naive(attention, x, positions))


def test_qk_norm_scopes_differ() -> None:
    per_head = make(qk_norm="rmsnorm", qk_norm_scope="head")
    whole = make(qk_norm="rmsnorm", qk_norm_scope="all")
    whole.qkv.load_state_dict(per_head.qkv.state_dict())
    whole.out.load_state_dict(per_head.out.state_dict())
    for n in (whole.q_norm, whole.k_norm, per_head.q_norm, per_head.k_norm):
        n.weight.data.fill_(1.0)
    x = torch.randn(1, 4, D, dtype=torch.float64)
    ctx = context(causal_positions(1, 4), plain_causal=True)
    assert not torch.allclose(per_head(x, ctx), whole(x, ctx))


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_per_head_weights_qk_norm_matches_its_formula(norm: str) -> None:
    """StableLM 2's q/k LayerNorm: each head's channels normalised, then scaled by that head's own weights."""
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2,
                                           "qk_norm": {"kind": norm, "eps": 1e-5, **({"bias": False} if norm == "layernorm" else {})},
                                           "qk_norm_scope": "per_head_weights"}
    attention = specformer.build(spec, seed=0).blocks[0].mixer.double()
    names = sorted(n for n, _ in attention.named_parameters() if "norm" in n)
    assert names == [f"k_norm.{h}.weight" for h in range(2)] + [f"q_norm.{h}.weight" for h in range(4)]
    for p in attention.parameters():
        p.data.normal_(0, 0.3)
    wq = torch.stack([attention.q_norm[h].weight for h in range(4)]).detach()  # (H, hd)
    wk = torch.stack([attention.k_norm[h].weight for h in range(2)]).detach()  # (KV, hd)

    def formula(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def one(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:  # t: (B, heads, T, hd), w: (heads, hd)
            if norm == "layernorm":
                t = t - t.mean(-1, keepdim=True)
            return t / torch.sqrt((t * t).mean(-1, keepdim=True) + 1e-5) * w[None, :, None, :]
        return one(q, wq), one(k, wk)

    x = torch.randn(2, 5, 32, dtype=torch.float64)
    positions = causal_positions(2, 5)
    rope = RotaryPositions(head_dim=8, context_length=32)
    expected = naive(attention, x, positions, rope, head_norms=formula)
    torch.testing.assert_close(attention(x, context(positions, rope, plain_causal=True)), expected)
    # One weight shared by the heads gives another result: the heads' own weights are used.
    shared = naive(attention, x, positions, rope, head_norms=lambda q, k: (attention.q_norm[0](q), attention.k_norm[0](k)))
    assert not torch.allclose(expected, shared)


def test_softcap_and_scale() -> None:
    attention = make(logit_softcap=0.5, scale=0.9)
    x = torch.randn(1, 6, D, dtype=torch.float64) * 3
    positions = causal_positions(1, 6)
    torch.testing.assert_close(attention(x, context(positions, plain_causal=True)), naive(attention, x, positions))
    uncapped = make(scale=0.9)
    uncapped.load_state_dict(attention.state_dict())
    assert not torch.allclose(uncapped(x, context(positions, plain_causal=True)),
                              attention(x, context(positions, plain_causal=True)))


GRIDS = {
    # Every combination of the options (slow suite).
    "full": list(itertools.product(
        [4, 2, 1],  # n_kv_heads: MHA, GQA, MQA
        [None, 3, 100],  # window: none, active, longer than the sequence
        [None, "head", "per_head_weights", "all"],  # qk_norm scope
        [None, 20.0],  # logit_softcap
        [None, 0.2],  # scale
    )),
    # Every heads x window x qk_norm combination, with (softcap, scale) cycling through its four
    # combinations so that each of them meets every value of the other options (default suite).
    "reduced": [(kv, w, qk, *[(None, None), (20.0, 0.2), (None, 0.2), (20.0, None)][i % 4])
                for i, (kv, w, qk) in enumerate(itertools.product([4, 2, 1], [None, 3, 100],
                                                                    [None, "head", "per_head_weights", "all"]))],
}


@pytest.mark.parametrize("grid", ["reduced", pytest.param("full", marks=pytest.mark.slow)])
@pytest.mark.parametrize("positional", ["rope", "alibi", "none"])
@pytest.mark.parametrize("mode", ["plain", "padded", "cached"])
def test_sdpa_and_eager_agree_for_every_option_combination(positional: str, mode: str, grid: str) -> None:
    scheme = {"rope": RotaryPositions(head_dim=6, context_length=32), "alibi": ALiBi(n_heads=4), "none": None}[positional]
    x = torch.randn(2, 7, D, dtype=torch.float64)
    for n_kv, window, qk, softcap, scale in GRIDS[grid]:
        options = {"n_kv_heads": n_kv, "window": window, "logit_softcap": softcap, "scale": scale}
        pair = []
        for backend in ("sdpa", "eager"):
            norms = {} if qk is None else {"qk_norm": "rmsnorm", "qk_norm_scope": qk}
            pair.append(make(backend=backend, **options, **norms))
        sdpa, eager = pair
        eager.load_state_dict(sdpa.state_dict())
        ys = []
        for m in (sdpa, eager):
            if mode == "plain":
                ys.append(m(x, context(causal_positions(2, 7), scheme, plain_causal=True)))
            elif mode == "padded":
                positions = torch.tensor([[-1, -1, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5, 6]])
                ys.append(m(x, context(positions, scheme))[:, 2:])
            else:
                cache = ListCache()
                first = m(x[:, :4], context(causal_positions(2, 4), scheme, cache=cache))
                rest = [m(x[:, t:t + 1], context(torch.full((2, 1), t), scheme, cache=cache)) for t in range(4, 7)]
                ys.append(torch.cat([first, *rest], dim=1))
        torch.testing.assert_close(ys[0], ys[1], msg=lambda m, o=options, q=qk: f"{o}, qk_norm {q}: {m}")


@pytest.mark.parametrize("window", [None, 3])
def test_cache_matches_one_forward(window: int | None) -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 4, "n_kv_heads": 1, "window": window}
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    x = torch.randint(0, 61, (2, 12))
    cache = ListCache()
    steps = [model(x[:, :5], positions=causal_positions(2, 5), cache=cache)]
    steps += [model(x[:, t:t + 1], positions=torch.full((2, 1), t), cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), model(x))


def test_window_changes_the_result() -> None:
    full = make(n_kv_heads=2)
    local = make(n_kv_heads=2, window=2)
    local.load_state_dict(full.state_dict())
    x = torch.randn(1, 6, D, dtype=torch.float64)
    ctx = context(causal_positions(1, 6), plain_causal=True)
    a, b = full(x, ctx), local(x, ctx)
    torch.testing.assert_close(a[:, :2], b[:, :2])  # the first two tokens see the same keys
    assert not torch.allclose(a[:, 2:], b[:, 2:])


def test_dropout_only_in_training() -> None:
    attention = make(dropout=0.5)
    x = torch.randn(2, 8, D, dtype=torch.float64)
    ctx = context(causal_positions(2, 8), plain_causal=True)
    attention.eval()
    torch.testing.assert_close(attention(x, ctx), attention(x, ctx))
    attention.train()
    assert not torch.allclose(attention(x, ctx), attention(x, ctx))


def test_scale_default_and_attributes() -> None:
    a = make(n_kv_heads=2, head_dim=10, window=7)
    assert a.scale == 1 / math.sqrt(10)
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.window) == (4, 2, 10, 7)
    assert a.qkv.out_features == (4 + 2 * 2) * 10 and a.out.in_features == 40


def test_bad_sizes() -> None:
    with pytest.raises(ValueError, match=r"n_kv_heads \(3\) must divide n_heads \(4\)"):
        CausalSelfAttentionParams(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match=r"n_heads \(5\) must divide d_model \(24\)"):
        CausalSelfAttention(CausalSelfAttentionParams(n_heads=5), d_model=D)
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 4, "qk_norm_scope": "layer"}
    with pytest.raises(specformer.SpecError, match="qk_norm_scope"):
        specformer.load_spec(spec)
