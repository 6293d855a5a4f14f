"""moa: a router picks top_k query/output projection pairs per token over shared keys and values (MoA, JetMoE)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

import specformer
from specformer_layers.attention.mixture_of_heads import MixtureOfHeads
from specformer_layers.attention.mixture_of_heads_params import MixtureOfHeadsParams
from specformer_layers.positional.rope import RotaryPositions

from ..support import ListCache, causal_positions, context, tiny_spec_over_vocab

D = 24


def make(**kwargs: object) -> MixtureOfHeads:
    params = MixtureOfHeadsParams(**{"n_experts": 5, "top_k": 2, "n_kv_heads": 3, "head_dim": 6, "out_bias": True,
                                     **kwargs})
    moa = MixtureOfHeads(params, d_model=D).double()
    for p in moa.parameters():
        p.data.normal_(0, 0.3)
    return moa


def reference(moa: MixtureOfHeads, x: torch.Tensor, positions: torch.Tensor, rope: RotaryPositions) -> torch.Tensor:
    """The mixture written out token by token and head by head.

    Router: logits l = x W_r^T; the top_k experts e_1..e_k by logit, weights w = softmax(l_{e_1..e_k}).
    Keys and values k, v = x W_kv^T (rows [k; v]), KV heads of hd, rotated keys.
    Slot j of token t: queries q_{t,j} = Q_{e_j} x_t split into KV heads, rotated; head i reads key/value head i:
    a_{t,j,i} = sum_{s<=t} softmax_s(q_{t,j,i} . k_{s,i} / sqrt(hd)) v_{s,i}.
    Output: y_t = sum_j w_j O_{e_j} [a_{t,j,0}; ...; a_{t,j,KV-1}] + b.
    """
    B, T, _ = x.shape
    KV, hd, top_k = moa.n_kv_heads, moa.head_dim, moa.top_k
    logits = x @ moa.router.weight.T  # (B, T, E)
    top_logits, chosen = logits.topk(top_k, dim=-1)
    w = torch.softmax(top_logits, dim=-1)  # (B, T, k)
    k, v = (x @ moa.kv.weight.T).split(KV * hd, dim=-1)
    state = rope.prepare(positions)
    k = rope.rotate(k.view(B, T, KV, hd).transpose(1, 2), state)  # (B, KV, T, hd)
    v = v.view(B, T, KV, hd).transpose(1, 2)
    out = torch.zeros_like(x)
    for b in range(B):
        for t in range(T):
            for j in range(top_k):
                e = int(chosen[b, t, j])
                q = (moa.experts_q[e] @ x[b, t]).view(1, KV, 1, hd)  # (1, KV, 1, hd): KV heads of one token
                q = rope.rotate(q, rope.prepare(positions[b:b + 1, t:t + 1]))
                heads = []
                for i in range(KV):
                    scores = k[b, i, :t + 1] @ q[0, i, 0] / math.sqrt(hd)  # (t+1,)
                    heads.append(torch.softmax(scores, dim=0) @ v[b, i, :t + 1])  # (hd,)
                out[b, t] += w[b, t, j] * (moa.experts_out[e] @ torch.cat(heads))
    return out + moa.out_bias


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
@pytest.mark.parametrize(("n_experts", "top_k", "n_kv_heads"), [(5, 2, 3), (4, 1, 2), (3, 3, 1)])
def test_mixture_of_heads_formula(backend: str, n_experts: int, top_k: int, n_kv_heads: int) -> None:
    moa = make(n_experts=n_experts, top_k=top_k, n_kv_heads=n_kv_heads, backend=backend)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 7, D, dtype=torch.float64)
    positions = causal_positions(2, 7)
    got = moa(x, context(positions, rope, plain_causal=True))
    torch.testing.assert_close(got, reference(moa, x, positions, rope))
    assert moa.n_heads == top_k * n_kv_heads and moa.n_kv_heads == n_kv_heads


def test_aux_loss_is_the_moe_load_balancing_loss() -> None:
    moa = make(aux_loss_coef=0.1)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    moa(x, context(causal_positions(2, 5), rope, plain_causal=True))
    logits = x.reshape(-1, D) @ moa.router.weight.T
    probs = logits.softmax(-1)
    counts = torch.zeros(5, dtype=x.dtype).index_add_(0, logits.topk(2, -1).indices.flatten(), torch.ones(20, dtype=x.dtype))
    expected = 0.1 * 5 * torch.sum(counts / 10 * probs.mean(0))  # E * sum_e f_e P_e, f_e = slots to e / tokens
    torch.testing.assert_close(moa.aux_loss, expected)
    moa_off = make(aux_loss_coef=0.0)
    moa_off(x, context(causal_positions(2, 5), rope, plain_causal=True))
    assert moa_off.aux_loss is None


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_cached_decode_and_left_padding_match_one_forward(backend: str) -> None:
    moa = make(backend=backend)
    rope = RotaryPositions(head_dim=6, context_length=16)
    x = torch.randn(2, 9, D, dtype=torch.float64)
    cache = ListCache()
    steps = [moa(x[:, :5], context(causal_positions(2, 5), rope, cache=cache))]
    steps += [moa(x[:, t:t + 1], context(torch.full((2, 1), t), rope, cache=cache)) for t in range(5, 9)]
    whole = moa(x, context(causal_positions(2, 9), rope, plain_causal=True))
    torch.testing.assert_close(torch.cat(steps, 1), whole)
    assert cache.layers[0][0].shape == (2, 3, 9, 6)  # the shared keys only: n_kv_heads, not top_k * n_kv_heads
    positions = torch.tensor([[-1, -1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    padded = moa(x[:, :6], context(positions, rope))
    alone = moa(x[:1, 2:6], context(causal_positions(1, 4), rope, plain_causal=True))
    torch.testing.assert_close(padded[:1, 2:], alone)


def test_decoder_generates_through_the_cache_and_collects_the_aux_loss() -> None:
    spec = tiny_spec_over_vocab()
    spec["model"]["block"]["mixer"] = {"kind": "moa", "n_experts": 4, "top_k": 2, "n_kv_heads": 2, "out_bias": True}
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    x = torch.randint(0, 61, (2, 10))
    cache = ListCache()
    steps = [model(x[:, :4], positions=causal_positions(2, 4), cache=cache)]
    steps += [model(x[:, t:t + 1], positions=torch.full((2, 1), t), cache=cache) for t in range(4, 10)]
    torch.testing.assert_close(torch.cat(steps, 1), model(x))
    assert model.auxiliary_loss() is not None


@pytest.mark.parametrize("changes", [{}, {"out_bias": False, "head_dim": None},
                                     {"router": {"kind": "sigmoid_topk", "bias": True}}])
def test_sized_matches_the_built_layer(changes: dict[str, object]) -> None:
    params = MixtureOfHeadsParams(**{"n_experts": 4, "top_k": 2, "n_kv_heads": 3, "head_dim": 5, "out_bias": True,
                                     **changes})
    built = MixtureOfHeads(params, d_model=D)
    sized = params.sized(d_model=D)
    assert sized.parameters == sum(p.numel() for p in built.parameters())
    assert (sized.n_heads, sized.n_kv_heads, sized.head_dim) == (built.n_heads, built.n_kv_heads, built.head_dim)
    per_expert = built.experts_q[0].numel() + built.experts_out[0].numel()
    assert built.active_parameters() == sized.parameters - 2 * per_expert  # two of four experts idle


@pytest.mark.parametrize(("changes", "message"), [
    ({"top_k": 5}, "top_k \\(5\\) cannot exceed n_experts \\(4\\)"),
    ({"head_dim": None, "n_kv_heads": 5}, "n_kv_heads \\(5\\) must divide d_model \\(24\\)"),
    ({"router": {"kind": "topk_sigmoid"}}, "weighting the input are not accepted"),
])
def test_bad_sizes_and_routers_are_refused(changes: dict[str, object], message: str) -> None:
    with pytest.raises((ValueError, ValidationError), match=message):
        MixtureOfHeads(MixtureOfHeadsParams(**{"n_experts": 4, "n_kv_heads": 3, **changes}), d_model=D)


def test_tensor_parallel_is_refused() -> None:
    class Mesh:
        def size(self) -> int:
            return 2

    with pytest.raises(ValueError, match="mixture of attention heads"):
        make().take_tensor_parallel_share(Mesh())
