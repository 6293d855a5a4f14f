"""Latent attention (``mla``): its cost over a hand-written module, and its cache beside GQA's.

1. Speed: a DeepSeek-V3-shaped model (MLA with a low-rank query, decoupled rotary part,
   interleaved RoPE; dense SwiGLU) built from a spec, and the same model written out by hand
   in plain PyTorch with the same weights (checked: same logits). Forward and training-step
   tokens/s, interleaved runs, ratio specformer / hand-written (``benchmarks/pairwise.py``).
2. ``--decode``: the generation cache of that model beside a GQA model of the same width
   (same d_model, heads and layers; 4 kv heads), measured from the cache ``generate`` really
   allocates (``StaticKVCache.for_model``), and decode tokens/s of both through ``generate``.

    python benchmarks/bench_mla.py                          # speed, CPU fp32
    python benchmarks/bench_mla.py --decode                 # cache bytes per token and decode speed
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import specformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pairwise import run_cli  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    # DeepSeek-V3's attention ratios (q_lora 1536, kv_lora 512, rope 64, nope 128, v 128 at d 7168, 128 heads)
    # scaled to a CPU-friendly width.
    "mla": dict(vocab=8192, d=512, n_layers=4, n_heads=8, q_lora=192, kv_lora=64, rope=16, nope=32, v=32,
                hidden=1536, theta=10000.0, context=1024),
}


def spec_for(shape: dict[str, Any]) -> dict[str, Any]:
    return {"model": {
        "vocab_size": shape["vocab"], "d_model": shape["d"], "n_layers": shape["n_layers"],
        "context_length": shape["context"], "tie_embeddings": False,
        "positional": {"kind": "rope", "theta": shape["theta"], "interleaved": True},
        "block": {"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-6},
                  "mixer": {"kind": "mla", "n_heads": shape["n_heads"], "q_lora_rank": shape["q_lora"],
                                "kv_lora_rank": shape["kv_lora"], "qk_rope_head_dim": shape["rope"],
                                "qk_nope_head_dim": shape["nope"], "v_head_dim": shape["v"]},
                  "ffn": {"kind": "swiglu", "hidden": shape["hidden"]}},
    }}


def gqa_spec_for(shape: dict[str, Any], n_kv: int = 4) -> dict[str, Any]:
    spec = spec_for(shape)
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": shape["n_heads"], "n_kv_heads": n_kv}
    spec["model"]["positional"] = {"kind": "rope", "theta": shape["theta"]}
    return spec


# -- the hand-written peer -------------------------------------------------------------------------


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Interleaved RoPE: channels (0, 1), (2, 3), ... turn together."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)


class PeerBlock(nn.Module):
    """DeepSeek-V2's attention written as the paper's equations, then a SwiGLU."""

    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        d, self.H, self.r, self.rope, self.nope, self.v = s["d"], s["n_heads"], s["kv_lora"], s["rope"], s["nope"], s["v"]
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.w_dq = nn.Linear(d, s["q_lora"], bias=False)
        self.q_norm = nn.Parameter(torch.ones(s["q_lora"]))
        self.w_uq = nn.Linear(s["q_lora"], self.H * (self.nope + self.rope), bias=False)
        self.w_dkv = nn.Linear(d, self.r + self.rope, bias=False)
        self.kv_norm = nn.Parameter(torch.ones(self.r))
        self.w_ukv = nn.Linear(self.r, self.H * (self.nope + self.v), bias=False)
        self.wo = nn.Linear(self.H * self.v, d, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.w1 = nn.Linear(d, s["hidden"], bias=False)
        self.w3 = nn.Linear(d, s["hidden"], bias=False)
        self.w2 = nn.Linear(s["hidden"], d, bias=False)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, _ = x.shape
        h = rms_norm(x, self.attn_norm)
        q = self.w_uq(rms_norm(self.w_dq(h), self.q_norm)).view(B, T, self.H, -1).transpose(1, 2)  # (B, H, T, nope+rope)
        q_nope, q_rope = q.split((self.nope, self.rope), -1)
        c, k_rope = self.w_dkv(h).split((self.r, self.rope), -1)
        kv = self.w_ukv(rms_norm(c, self.kv_norm)).view(B, T, self.H, -1).transpose(1, 2)  # (B, H, T, nope+v)
        k_nope, v = kv.split((self.nope, self.v), -1)
        k_rope = rotate_pairs(k_rope[:, None], cos, sin).expand(B, self.H, T, self.rope)
        q = torch.cat((q_nope, rotate_pairs(q_rope, cos, sin)), -1)
        k = torch.cat((k_nope, k_rope), -1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1 / math.sqrt(self.nope + self.rope))
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        h = rms_norm(x, self.ffn_norm)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class PeerModel(nn.Module):
    def __init__(self, s: dict[str, Any]) -> None:
        super().__init__()
        self.tok = nn.Embedding(s["vocab"], s["d"])
        self.layers = nn.ModuleList(PeerBlock(s) for _ in range(s["n_layers"]))
        self.norm = nn.Parameter(torch.ones(s["d"]))
        self.head = nn.Linear(s["d"], s["vocab"], bias=False)
        self.register_buffer("inv_freq", 1.0 / s["theta"] ** (torch.arange(0, s["rope"], 2).float() / s["rope"]),
                             persistent=False)

    def forward(self, idx: Tensor) -> Tensor:
        angles = torch.arange(idx.shape[1], device=idx.device).float()[:, None] * self.inv_freq  # (T, rope/2)
        cos, sin = angles.cos(), angles.sin()
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.head(rms_norm(x, self.norm))


def copy_weights(ours: specformer.Decoder, peer: PeerModel) -> PeerModel:
    sd = ours.state_dict()
    out = {"tok.weight": sd["embedding.weight"], "norm": sd["final_norm.weight"], "head.weight": sd["lm_head.weight"]}
    names = {"attention_norm.weight": "attn_norm", "mixer.q_a.weight": "w_dq.weight",
             "mixer.q_norm.weight": "q_norm", "mixer.q_b.weight": "w_uq.weight",
             "mixer.kv_a.weight": "w_dkv.weight", "mixer.kv_norm.weight": "kv_norm",
             "mixer.kv_b.weight": "w_ukv.weight", "mixer.out.weight": "wo.weight",
             "ffn_norm.weight": "ffn_norm", "ffn.down.weight": "w2.weight"}
    for i in range(len(peer.layers)):
        out.update({f"layers.{i}.{theirs}": sd[f"blocks.{i}.{mine}"] for mine, theirs in names.items()})
        gate, up = sd[f"blocks.{i}.ffn.gate_up.weight"].chunk(2)
        out.update({f"layers.{i}.w1.weight": gate, f"layers.{i}.w3.weight": up})
    peer.load_state_dict(out, strict=True)
    return peer


def make_pair(name: str, device: str) -> tuple[specformer.Decoder, PeerModel]:
    ours = specformer.build(spec_for(SHAPES[name]), seed=0, device=device)
    return ours, copy_weights(ours, PeerModel(SHAPES[name]).to(device))


# -- decode: cache memory per token ---------------------------------------------------------------


def decode(prompt: int = 64, new: int = 64, batch: int = 4) -> None:
    from specformer_generate import StaticKVCache, generate

    shape = SHAPES["mla"]
    print(f"torch {torch.__version__}, CPU fp32, threads {torch.get_num_threads()}, batch {batch}, "
          f"prompt {prompt} + {new} new tokens, d_model {shape['d']}, {shape['n_heads']} heads, {shape['n_layers']} layers")
    print(f"{'attention':<28} {'cache B/token':>14} {'cache B (this call)':>20} {'decode tok/s':>13}")
    ids = torch.randint(0, shape["vocab"], (batch, prompt), generator=torch.Generator().manual_seed(0))
    for label, spec in (("mla (latent + rotary key)", spec_for(shape)), ("gqa, 4 kv heads", gqa_spec_for(shape))):
        model = specformer.build(spec, seed=0).eval()
        cache = StaticKVCache.for_model(model, batch_size=1, capacity=1)
        per_token = sum(t.numel() * t.element_size() for layer in cache._layers.values() for t in (layer.keys, layer.values))
        full = StaticKVCache.for_model(model, batch_size=batch, capacity=prompt + new).nbytes
        generate(model, ids[:, :8], max_new_tokens=4)  # warm-up
        start = time.perf_counter()
        generate(model, ids, max_new_tokens=new)
        seconds = time.perf_counter() - start
        print(f"{label:<28} {per_token:>14,} {full:>20,} {batch * new / seconds:>13,.0f}")


def main() -> None:
    if "--decode" in sys.argv:
        decode()
        return
    run_cli(__doc__, shapes=SHAPES, make_pair=make_pair, default_seq=512)


if __name__ == "__main__":
    main()
