"""Does routing through a registered router cost anything over a hand-written DeepSeek-V3 MoE?

Builds a DeepSeek-V3-shaped model at a CPU-friendly width from a spec (fine-grained experts,
16 routed, top-4, sigmoid routing with the selection bias and node-limited groups (4 groups,
2 kept), routed scaling 2.5, one ungated shared expert, no auxiliary loss; load counted for
bias balancing while training) and a hand-written plain PyTorch model of the same
architecture with the same weights and a non-zero selection bias (checked: same logits),
then prints tokens/s of a forward pass and of a training step (forward, backward, AdamW,
and the bias update on both sides) and the ratio specformer / hand-written. Runs are
interleaved so drift in machine load hits both alike. Nothing is asserted.

    python benchmarks/bench_router.py                          # CPU fp32
    python benchmarks/bench_router.py --batch 4 --seq 256 --repeats 7
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import specformer
from specformer_train.router_balance import balance_routers

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pairwise  # noqa: E402
import bench_components  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "router": dict(vocab=8192, d=512, n_layers=4, n_heads=8, n_kv=2, hidden=256, experts=16, top_k=4,
                   n_group=4, topk_group=2, scaling=2.5, rate=0.001, theta=10000.0, context=1024),
}


def spec_for(shape: dict[str, Any]) -> dict[str, Any]:
    router = {"kind": "sigmoid_topk", "n_group": shape["n_group"], "topk_group": shape["topk_group"],
              "scaling_factor": shape["scaling"], "bias_update_rate": shape["rate"]}
    ffn = {"kind": "moe", "n_experts": shape["experts"], "top_k": shape["top_k"], "hidden": shape["hidden"],
           "n_shared_experts": 1, "aux_loss_coef": 0.0, "router": router}
    return {"model": {
        "vocab_size": shape["vocab"], "d_model": shape["d"], "n_layers": shape["n_layers"],
        "context_length": shape["context"], "tie_embeddings": False,
        "positional": {"kind": "rope", "theta": shape["theta"]},
        "block": {"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-5},
                  "mixer": {"kind": "attention", "n_heads": shape["n_heads"], "n_kv_heads": shape["n_kv"]},
                  "ffn": ffn},
    }}


# -- the hand-written peer -------------------------------------------------------------------------


class PeerDeepSeekMoE(nn.Module):
    """DeepSeek-V3's MoE as usually written: sigmoid, biased node-limited top-k, experts by index_add, shared expert."""

    def __init__(self, shape: dict[str, Any]) -> None:
        super().__init__()
        d, hidden, self.experts = shape["d"], shape["hidden"], shape["experts"]
        self.top_k, self.n_group, self.topk_group = shape["top_k"], shape["n_group"], shape["topk_group"]
        self.scaling, self.rate = shape["scaling"], shape["rate"]
        self.gate = nn.Parameter(torch.empty(self.experts, d))
        self.register_buffer("e_bias", torch.zeros(self.experts))
        self.w_gate_up = nn.Parameter(torch.empty(self.experts, 2 * hidden, d))
        self.w_down = nn.Parameter(torch.empty(self.experts, d, hidden))
        self.shared_gate_up = nn.Linear(d, 2 * hidden, bias=False)
        self.shared_down = nn.Linear(hidden, d, bias=False)
        self.load = torch.zeros(self.experts)

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        flat = x.view(-1, D)
        N = flat.shape[0]
        scores = F.linear(flat, self.gate).sigmoid()  # (N, E)
        choice = scores + self.e_bias
        group_scores = choice.view(N, self.n_group, -1).topk(2, dim=-1).values.sum(-1)  # (N, G)
        groups = group_scores.topk(self.topk_group, dim=-1).indices
        mask = torch.zeros_like(group_scores).scatter_(1, groups, 1.0).bool()
        mask = mask[..., None].expand(N, self.n_group, self.experts // self.n_group).reshape(N, -1)
        chosen = choice.masked_fill(~mask, float("-inf")).topk(self.top_k, dim=-1).indices  # (N, k)
        weights = scores.gather(1, chosen)
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20) * self.scaling
        if self.training:
            self.load = self.load + torch.bincount(chosen.flatten(), minlength=self.experts).float()
        out = torch.zeros_like(flat)
        for e in range(self.experts):
            token, slot = torch.where(chosen == e)
            if token.numel() == 0:
                continue
            gate, up = F.linear(flat[token], self.w_gate_up[e]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.w_down[e]) * weights[token, slot, None]
            out.index_add_(0, token, y)
        gate, up = self.shared_gate_up(flat).chunk(2, dim=-1)
        out = out + self.shared_down(F.silu(gate) * up)
        return out.view(B, T, D)

    def update_bias(self) -> None:
        with torch.no_grad():
            self.e_bias += self.rate * torch.sign(self.load.mean() - self.load)
        self.load = torch.zeros(self.experts)


class PeerBlock(bench_components.PeerBlock):
    """bench_components' hand-written Llama block with DeepSeek-V3's MoE as its feed-forward."""

    def __init__(self, shape: dict[str, Any]) -> None:
        super().__init__({**shape, "experts": 0})
        del self.w1, self.w2, self.w3  # the dense FFN the base builds without experts
        self.moe = PeerDeepSeekMoE(shape)


class PeerModel(bench_components.PeerModel):
    """bench_components' hand-written model (plain causal) with the blocks above."""

    def __init__(self, shape: dict[str, Any]) -> None:
        super().__init__({**shape, "experts": 0, "window": None})
        self.layers = nn.ModuleList(PeerBlock(shape) for _ in range(shape["n_layers"]))

    def auxiliary_loss(self) -> None:
        return None  # balanced by the selection bias, no loss term

    def after_optimizer_step(self) -> None:
        for layer in self.layers:
            layer.moe.update_bias()


def copy_weights(ours: specformer.Decoder, peer: PeerModel) -> PeerModel:
    sd = ours.state_dict()
    out = {"tok.weight": sd["embedding.weight"], "norm": sd["final_norm.weight"], "head.weight": sd["lm_head.weight"]}
    for i, layer in enumerate(peer.layers):
        p, m = f"blocks.{i}.", f"layers.{i}.moe."
        q, k, v = sd[p + "mixer.qkv.weight"].split(
            (layer.n_heads * layer.hd, layer.n_kv * layer.hd, layer.n_kv * layer.hd))
        out.update({f"layers.{i}.attn_norm": sd[p + "attention_norm.weight"],
                    f"layers.{i}.ffn_norm": sd[p + "ffn_norm.weight"],
                    f"layers.{i}.wq.weight": q, f"layers.{i}.wk.weight": k, f"layers.{i}.wv.weight": v,
                    f"layers.{i}.wo.weight": sd[p + "mixer.out.weight"],
                    m + "gate": sd[p + "ffn.router.weight"], m + "e_bias": sd[p + "ffn.router.selection_bias"],
                    m + "w_gate_up": sd[p + "ffn.experts_in"], m + "w_down": sd[p + "ffn.experts_out"],
                    m + "shared_gate_up.weight": sd[p + "ffn.shared.gate_up.weight"],
                    m + "shared_down.weight": sd[p + "ffn.shared.down.weight"]})
    peer.load_state_dict(out, strict=True)
    return peer


def make_pair(name: str, device: str) -> tuple[nn.Module, nn.Module]:
    shape = SHAPES[name]
    ours = specformer.build(spec_for(shape), seed=0, device=device)
    generator = torch.Generator().manual_seed(1)
    for block in ours.blocks:  # a bias that changes choices, as after some training
        block.ffn.router.selection_bias.copy_(torch.randn(shape["experts"], generator=generator) * 0.02)
    peer = copy_weights(ours, PeerModel(shape).to(device))
    # The bias update belongs to the training step: pairwise.train_step runs these after each optimizer step.
    ours.after_optimizer_step = lambda: balance_routers(ours)
    return ours, peer


def main() -> None:
    pairwise.run_cli(__doc__, shapes=SHAPES, make_pair=make_pair, default_seq=512)


if __name__ == "__main__":
    main()
