"""Plain PyTorch GPT-2 and Llama modules, written out by hand: the peer the overhead benchmark
compares specformer against, and an independent reference for whole-model logits in tests.

Nothing here imports specformer except :func:`copy_weights_from`, which maps a built
Decoder's tensors onto these modules so both compute with the same weights.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor, nn


class GPT2Block(nn.Module):
    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)  # (B, H, T, hd)
        k = k.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        v = v.view(B, T, self.n_heads, C // self.n_heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, *, vocab: int, d: int, n_layers: int, n_heads: int, context: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.h = nn.ModuleList(GPT2Block(d, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, idx: Tensor) -> Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


class LlamaBlock(nn.Module):
    def __init__(self, d: int, n_heads: int, n_kv: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = n_heads, n_kv, d // n_heads
        self.eps = eps
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wq = nn.Linear(d, n_heads * self.hd, bias=False)
        self.wk = nn.Linear(d, n_kv * self.hd, bias=False)
        self.wv = nn.Linear(d, n_kv * self.hd, bias=False)
        self.wo = nn.Linear(n_heads * self.hd, d, bias=False)
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def rms(self, x: Tensor, w: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        B, T, _ = x.shape
        h = self.rms(x, self.attn_norm)
        q = self.wq(h).view(B, T, self.n_heads, self.hd).transpose(1, 2)  # (B, H, T, hd)
        k = self.wk(h).view(B, T, self.n_kv, self.hd).transpose(1, 2)  # (B, KV, T, hd)
        v = self.wv(h).view(B, T, self.n_kv, self.hd).transpose(1, 2)
        q, k = rotate_half_split(q, cos, sin), rotate_half_split(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv != self.n_heads)
        x = x + self.wo(y.transpose(1, 2).reshape(B, T, -1))
        h = self.rms(x, self.ffn_norm)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


def rotate_half_split(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


class Llama(nn.Module):
    def __init__(self, *, vocab: int, d: int, n_layers: int, n_heads: int, n_kv: int, hidden: int,
                 theta: float = 10000.0, eps: float = 1e-5) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaBlock(d, n_heads, n_kv, hidden, eps) for _ in range(n_layers))
        self.norm = nn.Parameter(torch.ones(d))
        self.eps = eps
        hd = d // n_heads
        self.register_buffer("inv_freq", 1.0 / theta ** (torch.arange(0, hd, 2).float() / hd), persistent=False)

    def forward(self, idx: Tensor) -> Tensor:
        angles = torch.arange(idx.shape[1], device=idx.device).float()[:, None] * self.inv_freq  # (T, hd/2)
        cos, sin = angles.cos(), angles.sin()
        x = self.tok(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.norm
        return F.linear(x, self.tok.weight)


def copy_weights_from(decoder: nn.Module, peer: nn.Module) -> nn.Module:
    """Load a specformer Decoder's weights into a hand-written GPT2 or Llama."""
    sd = decoder.state_dict()
    out: dict[str, Tensor] = {}
    if isinstance(peer, GPT2):
        out["wte.weight"] = sd["embedding.weight"]
        out["wpe.weight"] = sd["positional.table.weight"]
        out["ln_f.weight"], out["ln_f.bias"] = sd["final_norm.weight"], sd["final_norm.bias"]
        for i in range(len(peer.h)):
            p = f"blocks.{i}."
            for ours, theirs in (("attention_norm", "ln_1"), ("ffn_norm", "ln_2")):
                out[f"h.{i}.{theirs}.weight"] = sd[p + ours + ".weight"]
                out[f"h.{i}.{theirs}.bias"] = sd[p + ours + ".bias"]
            for ours, theirs in (("attention.qkv", "c_attn"), ("attention.out", "c_proj"),
                                 ("ffn.fc_in", "c_fc"), ("ffn.fc_out", "mlp_proj")):
                out[f"h.{i}.{theirs}.weight"] = sd[p + ours + ".weight"]
                out[f"h.{i}.{theirs}.bias"] = sd[p + ours + ".bias"]
    elif isinstance(peer, Llama):
        out["tok.weight"] = sd["embedding.weight"]
        out["norm"] = sd["final_norm.weight"]
        for i, layer in enumerate(peer.layers):
            p = f"blocks.{i}."
            q, k, v = sd[p + "attention.qkv.weight"].split(
                (layer.n_heads * layer.hd, layer.n_kv * layer.hd, layer.n_kv * layer.hd))
            gate, up = sd[p + "ffn.gate_up.weight"].chunk(2)
            out.update({
                f"layers.{i}.attn_norm": sd[p + "attention_norm.weight"],
                f"layers.{i}.ffn_norm": sd[p + "ffn_norm.weight"],
                f"layers.{i}.wq.weight": q, f"layers.{i}.wk.weight": k, f"layers.{i}.wv.weight": v,
                f"layers.{i}.wo.weight": sd[p + "attention.out.weight"],
                f"layers.{i}.w1.weight": gate, f"layers.{i}.w3.weight": up,
                f"layers.{i}.w2.weight": sd[p + "ffn.down.weight"],
            })
    else:
        raise TypeError(f"no weight mapping for {type(peer).__name__}")
    peer.load_state_dict(out, strict=True)
    return peer


def gpt2_spec(*, vocab: int, d: int, n_layers: int, n_heads: int, context: int) -> dict:
    """The specformer spec of :class:`GPT2` with the same sizes."""
    return {"model": {
        "vocab_size": vocab, "d_model": d, "n_layers": n_layers, "context_length": context,
        "positional": "learned",
        "block": {"layout": "prenorm", "norm": {"kind": "layernorm", "eps": 1e-5},
                  "attention": {"kind": "attention", "n_heads": n_heads, "qkv_bias": True, "out_bias": True},
                  "ffn": {"kind": "mlp", "hidden": 4 * d, "activation": "gelu_tanh", "bias": True}},
    }}


def llama_spec(*, vocab: int, d: int, n_layers: int, n_heads: int, n_kv: int, hidden: int, context: int,
               theta: float = 10000.0, eps: float = 1e-5) -> dict:
    """The specformer spec of :class:`Llama` with the same sizes."""
    return {"model": {
        "vocab_size": vocab, "d_model": d, "n_layers": n_layers, "context_length": context,
        "positional": {"kind": "rope", "theta": theta},
        "block": {"norm": {"kind": "rmsnorm", "eps": eps},
                  "attention": {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_kv},
                  "ffn": {"kind": "swiglu", "hidden": hidden}},
    }}


def count_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


