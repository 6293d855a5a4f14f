"""Do the catalogue's heavier components cost anything over plain PyTorch?

Builds a Mixtral-shaped (sparse MoE, 8 experts, top-2) and a Mistral-shaped (sliding-window
attention) model from specs and a hand-written plain PyTorch module of the same architecture
with the same weights (checked: same logits), then prints tokens/s of a forward pass and of a
training step (forward, backward, AdamW; the MoE load-balancing loss included on both sides)
for both, and the ratio specformer / hand-written. Runs are interleaved (ours, peer, ours, ...)
so drift in machine load hits both alike. Nothing is asserted: this is a measurement.

    python benchmarks/bench_components.py                      # both, CPU fp32
    python benchmarks/bench_components.py --model moe --batch 4 --seq 256 --repeats 7
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
from pairwise import run_cli  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    # Mixtral 8x7B's design (8 SwiGLU experts, top-2, GQA 4:1, RoPE theta 1e6) at a CPU-friendly width.
    "moe": dict(vocab=8192, d=512, n_layers=4, n_heads=8, n_kv=2, hidden=1024, experts=8, top_k=2,
                window=None, theta=1e6, context=1024),
    # Mistral 7B's design (sliding window in every layer, GQA 4:1, SwiGLU) with a window shorter than the sequence.
    "window": dict(vocab=8192, d=512, n_layers=4, n_heads=8, n_kv=2, hidden=1536, experts=0, top_k=0,
                   window=128, theta=10000.0, context=1024),
}


def spec_for(shape: dict[str, Any]) -> dict[str, Any]:
    attention: dict[str, Any] = {"kind": "attention", "n_heads": shape["n_heads"], "n_kv_heads": shape["n_kv"]}
    if shape["window"]:
        attention["window"] = shape["window"]
    ffn: dict[str, Any] = {"kind": "swiglu", "hidden": shape["hidden"]}
    if shape["experts"]:
        ffn = {"kind": "moe", "n_experts": shape["experts"], "top_k": shape["top_k"], "hidden": shape["hidden"],
               "aux_loss_coef": 0.02}
    return {"model": {
        "vocab_size": shape["vocab"], "d_model": shape["d"], "n_layers": shape["n_layers"],
        "context_length": shape["context"], "tie_embeddings": False,
        "positional": {"kind": "rope", "theta": shape["theta"]},
        "block": {"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-5}, "mixer": attention, "ffn": ffn},
    }}


# -- the hand-written peer -------------------------------------------------------------------------


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-5) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class PeerMoE(nn.Module):
    """Mixtral's sparse block as usually written: softmax, top-k, then each expert on the tokens that chose it."""

    def __init__(self, d: int, hidden: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.top_k, self.experts = top_k, experts
        self.gate = nn.Linear(d, experts, bias=False)
        self.w_gate_up = nn.Parameter(torch.empty(experts, 2 * hidden, d))
        self.w_down = nn.Parameter(torch.empty(experts, d, hidden))
        self.aux_loss = torch.zeros(())

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        flat = x.view(-1, D)
        probs = torch.softmax(self.gate(flat).float(), dim=-1)
        weights, chosen = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        counts = F.one_hot(chosen, self.experts).sum(dim=(0, 1)).float()
        self.aux_loss = 0.02 * self.experts * torch.sum(counts / flat.shape[0] * probs.mean(0))
        out = torch.zeros_like(flat)
        for e in range(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel() == 0:
                continue
            gate, up = F.linear(flat[token], self.w_gate_up[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.w_down[e]) * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out.view(B, T, D)


class PeerBlock(nn.Module):
    def __init__(self, shape: dict[str, Any]) -> None:
        super().__init__()
        d, self.n_heads, self.n_kv = shape["d"], shape["n_heads"], shape["n_kv"]
        self.hd = d // self.n_heads
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wq = nn.Linear(d, self.n_heads * self.hd, bias=False)
        self.wk = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.wv = nn.Linear(d, self.n_kv * self.hd, bias=False)
        self.wo = nn.Linear(self.n_heads * self.hd, d, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(d))
        if shape["experts"]:
            self.moe: PeerMoE | None = PeerMoE(d, shape["hidden"], shape["experts"], shape["top_k"])
        else:
            self.moe = None
            self.w1 = nn.Linear(d, shape["hidden"], bias=False)
            self.w3 = nn.Linear(d, shape["hidden"], bias=False)
            self.w2 = nn.Linear(shape["hidden"], d, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None) -> Tensor:
        B, T, _ = x.shape
        h = rms_norm(x, self.attn_norm)
        q = self.wq(h).view(B, T, self.n_heads, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(h).view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, KV, T, hd)
        v = self.wv(h).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        h = rms_norm(x, self.ffn_norm)
        if self.moe is not None:
            return x + self.moe(h)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class PeerModel(nn.Module):
    def __init__(self, shape: dict[str, Any]) -> None:
        super().__init__()
        self.window = shape["window"]
        self.tok = nn.Embedding(shape["vocab"], shape["d"])
        self.layers = nn.ModuleList(PeerBlock(shape) for _ in range(shape["n_layers"]))
        self.norm = nn.Parameter(torch.ones(shape["d"]))
        self.head = nn.Linear(shape["d"], shape["vocab"], bias=False)
        hd = shape["d"] // shape["n_heads"]
        self.register_buffer("inv_freq", 1.0 / shape["theta"] ** (torch.arange(0, hd, 2).float() / hd), persistent=False)

    def forward(self, idx: Tensor) -> Tensor:
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        angles = pos.float()[:, None] * self.inv_freq  # (T, hd/2)
        cos, sin = angles.cos(), angles.sin()
        mask = None
        if self.window is not None and T > self.window:
            distance = pos[:, None] - pos[None, :]  # (T, T)
            mask = (distance >= 0) & (distance < self.window)
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.head(rms_norm(x, self.norm))

    def auxiliary_loss(self) -> Tensor | None:
        losses = [layer.moe.aux_loss for layer in self.layers if layer.moe is not None]
        return torch.stack(losses).sum() if losses else None


def copy_weights(ours: specformer.Decoder, peer: PeerModel) -> PeerModel:
    sd = ours.state_dict()
    out = {"tok.weight": sd["embedding.weight"], "norm": sd["final_norm.weight"], "head.weight": sd["lm_head.weight"]}
    for i, layer in enumerate(peer.layers):
        p = f"blocks.{i}."
        q, k, v = sd[p + "mixer.qkv.weight"].split(
            (layer.n_heads * layer.hd, layer.n_kv * layer.hd, layer.n_kv * layer.hd))
        out.update({f"layers.{i}.attn_norm": sd[p + "attention_norm.weight"],
                    f"layers.{i}.ffn_norm": sd[p + "ffn_norm.weight"],
                    f"layers.{i}.wq.weight": q, f"layers.{i}.wk.weight": k, f"layers.{i}.wv.weight": v,
                    f"layers.{i}.wo.weight": sd[p + "mixer.out.weight"]})
        if layer.moe is not None:
            out.update({f"layers.{i}.moe.gate.weight": sd[p + "ffn.router.weight"],
                        f"layers.{i}.moe.w_gate_up": sd[p + "ffn.experts_in"],
                        f"layers.{i}.moe.w_down": sd[p + "ffn.experts_out"]})
        else:
            gate, up = sd[p + "ffn.gate_up.weight"].chunk(2)
            out.update({f"layers.{i}.w1.weight": gate, f"layers.{i}.w3.weight": up,
                        f"layers.{i}.w2.weight": sd[p + "ffn.down.weight"]})
    peer.load_state_dict(out, strict=True)
    return peer


def make_pair(name: str, device: str) -> tuple[specformer.Decoder, PeerModel]:
    ours = specformer.build(spec_for(SHAPES[name]), seed=0, device=device)
    return ours, copy_weights(ours, PeerModel(SHAPES[name]).to(device))


def main() -> None:
    run_cli(__doc__, shapes=SHAPES, make_pair=make_pair, default_seq=512)


if __name__ == "__main__":
    main()
