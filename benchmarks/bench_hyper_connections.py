"""Manifold-constrained hyper-connections (``residual: mhc``, N = 4): their cost over a hand-written module.

A Llama-shaped model (pre-norm, GQA attention with RoPE, SwiGLU) on 4 residual streams,
built from a spec, and the same model written out by hand in plain PyTorch with the same
weights (checked: same logits): the streams copied from the embeddings, each sublayer
reading them through DeepSeek-V4's pre weights, writing through post and mixing them through
the Sinkhorn-normalised comb matrix, and a head collapsing them before the final norm.
Forward and training-step tokens/s, interleaved runs, ratio specformer / hand-written
(``benchmarks/pairwise.py``).

    python benchmarks/bench_hyper_connections.py                     # CPU fp32
    python benchmarks/bench_hyper_connections.py --seq 256 --repeats 9
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import specformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_components import rms_norm, rotate, spec_for as dense_spec_for  # noqa: E402
from pairwise import run_cli  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    # DeepSeek-V4's 4 streams and 20 Sinkhorn steps around a small dense Llama-shaped block.
    "mhc": dict(vocab=8192, d=256, n_layers=4, n_heads=4, n_kv=2, hidden=768, theta=10000.0, context=1024,
                streams=4, sinkhorn=20, hc_eps=1e-6, norm_eps=1e-6),
}


def spec_for(shape: dict[str, Any]) -> dict[str, Any]:
    """bench_components' dense Llama-shaped spec, on the streams."""
    spec = dense_spec_for({**shape, "window": None, "experts": 0, "top_k": 0})
    spec["model"]["block"]["residual"] = {"kind": "mhc", "n_streams": shape["streams"],
                                          "sinkhorn_iterations": shape["sinkhorn"], "eps": shape["hc_eps"],
                                          "norm_eps": shape["norm_eps"]}
    return spec


# -- the hand-written peer -------------------------------------------------------------------------


class PeerHyperConnection(nn.Module):
    """One sublayer's hyper-connection as DeepSeek-V4 writes it: weights from the streams, then collapse."""

    def __init__(self, n: int, d: int, *, iters: int, eps: float, norm_eps: float) -> None:
        super().__init__()
        self.n, self.iters, self.eps, self.norm_eps = n, iters, eps, norm_eps
        self.fn = nn.Parameter(torch.empty(n * (n + 2), n * d))
        self.base = nn.Parameter(torch.empty(n * (n + 2)))
        self.scale = nn.Parameter(torch.empty(3))

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        B, T, n = h.shape[0], h.shape[1], self.n
        flat = h.reshape(B, T, -1).float()
        flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        mixes = flat @ self.fn.t()
        pre = torch.sigmoid(mixes[..., :n] * self.scale[0] + self.base[:n]) + self.eps
        post = 2 * torch.sigmoid(mixes[..., n:2 * n] * self.scale[1] + self.base[n:2 * n])
        comb = mixes[..., 2 * n:].reshape(B, T, n, n) * self.scale[2] + self.base[2 * n:].reshape(n, n)
        comb = torch.softmax(comb, dim=-1) + self.eps
        comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        for _ in range(self.iters - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        x = (pre[..., None] * h).sum(2).to(h.dtype)
        return x, post, comb


def hc_write(h: Tensor, out: Tensor, post: Tensor, comb: Tensor) -> Tensor:
    return post[..., None] * out[:, :, None, :] + comb.transpose(-1, -2) @ h


class PeerBlock(nn.Module):
    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        d, self.n_heads, self.n_kv = s["d"], s["n_heads"], s["n_kv"]
        self.hd = d // self.n_heads
        hc = dict(iters=s["sinkhorn"], eps=s["hc_eps"], norm_eps=s["norm_eps"])
        self.attn_hc = PeerHyperConnection(s["streams"], d, **hc)
        self.ffn_hc = PeerHyperConnection(s["streams"], d, **hc)
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wqkv = nn.Linear(d, (self.n_heads + 2 * self.n_kv) * self.hd, bias=False)
        self.wo = nn.Linear(self.n_heads * self.hd, d, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.w13 = nn.Linear(d, 2 * s["hidden"], bias=False)
        self.w2 = nn.Linear(s["hidden"], d, bias=False)

    def forward(self, h: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T = h.shape[:2]
        x, post, comb = self.attn_hc(h)
        q, k, v = self.wqkv(rms_norm(x, self.attn_norm)).split(
            (self.n_heads * self.hd, self.n_kv * self.hd, self.n_kv * self.hd), -1)
        q = q.view(B, T, self.n_heads, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, KV, T, hd)
        v = v.view(B, T, self.n_kv, self.hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True, enable_gqa=True)
        h = hc_write(h, self.wo(y.transpose(1, 2).reshape(B, T, -1)), post, comb)
        x, post, comb = self.ffn_hc(h)
        gate, up = self.w13(rms_norm(x, self.ffn_norm)).chunk(2, -1)
        return hc_write(h, self.w2(F.silu(gate) * up), post, comb)


class PeerModel(nn.Module):
    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        self.n, self.eps, self.norm_eps = s["streams"], s["hc_eps"], s["norm_eps"]
        self.tok = nn.Embedding(s["vocab"], s["d"])
        self.layers = nn.ModuleList(PeerBlock(s) for _ in range(s["n_layers"]))
        self.head_fn = nn.Parameter(torch.empty(self.n, self.n * s["d"]))
        self.head_base = nn.Parameter(torch.empty(self.n))
        self.head_scale = nn.Parameter(torch.empty(1))
        self.norm = nn.Parameter(torch.ones(s["d"]))
        self.head = nn.Linear(s["d"], s["vocab"], bias=False)
        hd = s["d"] // s["n_heads"]
        self.register_buffer("inv_freq", 1.0 / s["theta"] ** (torch.arange(0, hd, 2).float() / hd), persistent=False)

    def forward(self, idx: Tensor) -> Tensor:
        B, T = idx.shape
        angles = torch.arange(T, device=idx.device).float()[:, None] * self.inv_freq  # (T, hd/2)
        cos, sin = angles.cos(), angles.sin()
        h = self.tok(idx)[:, :, None, :].repeat(1, 1, self.n, 1)  # (B, T, N, D)
        for layer in self.layers:
            h = layer(h, cos, sin)
        flat = h.reshape(B, T, -1).float()
        flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.norm_eps)
        pre = torch.sigmoid(flat @ self.head_fn.t() * self.head_scale + self.head_base) + self.eps
        x = (pre[..., None] * h).sum(2)
        return self.head(rms_norm(x, self.norm))


def copy_weights(ours: specformer.Decoder, peer: PeerModel) -> PeerModel:
    sd = ours.state_dict()
    out = {"tok.weight": sd["embedding.weight"], "norm": sd["final_norm.weight"], "head.weight": sd["lm_head.weight"],
           "head_fn": sd["residual.fn"], "head_base": sd["residual.base"], "head_scale": sd["residual.scale"]}
    for i in range(len(peer.layers)):
        p, q = f"blocks.{i}.", f"layers.{i}."
        out.update({q + "attn_norm": sd[p + "attention_norm.weight"], q + "ffn_norm": sd[p + "ffn_norm.weight"],
                    q + "wqkv.weight": sd[p + "mixer.qkv.weight"], q + "wo.weight": sd[p + "mixer.out.weight"],
                    q + "w13.weight": sd[p + "ffn.gate_up.weight"], q + "w2.weight": sd[p + "ffn.down.weight"]})
        for mine, theirs in (("attention_residual", "attn_hc"), ("ffn_residual", "ffn_hc")):
            out.update({f"{q}{theirs}.{w}": sd[f"{p}{mine}.{w}"] for w in ("fn", "base", "scale")})
    peer.load_state_dict(out, strict=True)
    return peer


def make_pair(name: str, device: str) -> tuple[specformer.Decoder, PeerModel]:
    ours = specformer.build(spec_for(SHAPES[name]), seed=0, device=device)
    with torch.no_grad():  # random stream weights, so a swapped group would show in the logits check
        for n, p in ours.named_parameters():
            if "residual" in n:
                p.normal_(0.0, 0.5)
    return ours, copy_weights(ours, PeerModel(SHAPES[name]).to(device))


def main() -> None:
    run_cli(__doc__, shapes=SHAPES, make_pair=make_pair, default_seq=256)


if __name__ == "__main__":
    main()
