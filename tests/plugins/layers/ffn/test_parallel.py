"""Feed-forwards side by side (Gemma 4's MLP beside its MoE) and the normed softmax top-k router, against formulas."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specformer.registry.discovery import get_registry

D = 16


def _make(kind: str, ref: dict, **sizes: object) -> torch.nn.Module:
    torch.manual_seed(0)
    return get_registry().resolve(kind, ref).make(**sizes).double()


def _rms(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


@torch.no_grad()
def test_the_normed_router_follows_its_formula() -> None:
    """p = softmax(W (rms(x) * s / sqrt(d))); keep the top k; w_j = p_j / sum_kept p * e[j]."""
    router = _make("router", {"kind": "normed_softmax_topk"}, d_model=D, n_experts=5, top_k=2)
    router.scale.normal_()
    router.expert_scale.uniform_(0.5, 2.0)
    x = torch.randn(7, D, dtype=torch.float64)
    probs = (_rms(x) * router.scale / D**0.5 @ router.weight.T).softmax(-1)
    kept, experts = probs.topk(2, dim=-1)
    weights, chosen, got_probs = router(x)
    assert torch.equal(chosen, experts)
    torch.testing.assert_close(got_probs, probs, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(weights, kept / kept.sum(-1, keepdim=True) * router.expert_scale[experts],
                               rtol=1e-12, atol=1e-12)


@torch.no_grad()
def test_each_branch_runs_between_its_own_norms_and_the_mixture_routes_on_the_raw_input() -> None:
    """out = post_0(mlp(pre_0(x))) + post_1(moe(pre_1(x)) routed by x)."""
    ffn = _make("ffn", {"kind": "parallel", "ffns": [
        {"kind": "geglu", "hidden": 12, "activation": "gelu_tanh"},
        {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 6, "activation": "gelu_tanh",
         "router": {"kind": "normed_softmax_topk"}}]}, d_model=D, layer_index=0, n_layers=1)
    for norm in [*ffn.pre_norms, *ffn.post_norms]:
        norm.weight.normal_()
    x = torch.randn(2, 3, D, dtype=torch.float64)
    mlp, moe = ffn.ffns
    pre0, pre1 = (n.weight for n in ffn.pre_norms)
    post0, post1 = (n.weight for n in ffn.post_norms)
    gate, up = (_rms(x) * pre0 @ mlp.gate_up.weight.T).chunk(2, -1)
    dense = _rms(F.gelu(gate, approximate="tanh") * up @ mlp.down.weight.T) * post0
    weights, experts, _ = moe.router(x.reshape(-1, D))  # the router reads x, not pre_1(x)
    tokens = (_rms(x) * pre1).reshape(-1, D)
    mixed = torch.zeros_like(tokens)
    for n in range(tokens.shape[0]):
        for j in range(2):
            e = experts[n, j]
            g, u = (tokens[n] @ moe.experts_in[e].T).chunk(2)
            mixed[n] += weights[n, j] * (F.gelu(g, approximate="tanh") * u @ moe.experts_out[e].T)
    sparse = _rms(mixed.view(2, 3, D)) * post1
    torch.testing.assert_close(ffn(x), dense + sparse, rtol=1e-10, atol=1e-10)
