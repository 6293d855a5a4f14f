"""Compressed attention (``compressed``, DeepSeek-V4): the formula written out here, transformers' module, the cache.

The formula, for query t (positions from 0), one shared key/value head, rotary channels last:

    kv_s  = RoPE_s(norm(W_kv x_s))                         a token's key, which is also its value
    q_t,h = RoPE_t(rms(W_qb,h norm(W_qa x_t)))             rms: no weight, per head
    block b holds tokens b*m .. b*m + m - 1 (m = compress_rate); slot j of it:
    e_b   = RoPE_{b*m}(norm(sum_j softmax_j(Z_j + B_j) * C_j))     C = W_c x, Z = W_z x, per channel
            (overlap: the slots are block b-1's first half of [C | Z] and block b's second)
    keys  = {kv_s : t - W < s <= t}  +  {e_b : (b + 1) * m <= t + 1}
    o_t,h = RoPE_{-t}(sum_k softmax_k(q_t,h . k / sqrt(d), sink_h) k)
    out   = W_o o_t            (grouped: W_mix [W_down,g o_t,g for each group g])
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.model.context import ForwardContext
from specformer_layers.attention.compressed import CompressedAttention
from specformer_layers.attention.params import CompressedAttentionParams
from specformer_layers.positional.params import RotaryPositionsParams
from specformer_layers.positional.rope import RotaryPositions

D, H, HD, ROPE, QR = 32, 4, 16, 8, 8


def layer(**changes: Any) -> CompressedAttention:
    params = {"n_heads": H, "head_dim": HD, "q_lora_rank": QR, "rope_dim": ROPE, "window": 4, **changes}
    torch.manual_seed(0)
    attn = CompressedAttention(CompressedAttentionParams(**params), d_model=D).double()
    with torch.no_grad():
        for p in attn.parameters():  # every tensor random: a zero bias or sink would hide its handling
            p.normal_(0, 0.3)
    return attn


def context(T: int, theta: float = 10000.0, B: int = 2) -> ForwardContext:
    scheme = RotaryPositions(RotaryPositionsParams(theta=theta, interleaved=True), head_dim=ROPE, context_length=64).double()
    positions = torch.arange(T).expand(B, T)
    return ForwardContext(positions=positions, positional=scheme, positional_state=scheme.prepare(positions))


# -- the formula, token by token ---------------------------------------------------------------

def rope(v: torch.Tensor, position: float, theta: float = 10000.0) -> torch.Tensor:
    """Turn the last ROPE channels of ``v`` (..., HD) by ``position``, pairs (0,1), (2,3), ... as complex numbers."""
    freqs = theta ** (-torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)
    pairs = torch.view_as_complex(v[..., -ROPE:].reshape(*v.shape[:-1], ROPE // 2, 2).contiguous())
    turned = torch.view_as_real(pairs * torch.polar(torch.ones_like(freqs), position * freqs)).flatten(-2)
    return torch.cat((v[..., :-ROPE], turned), dim=-1)


def rms(v: torch.Tensor, w: torch.Tensor | None = None) -> torch.Tensor:
    out = v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)
    return out if w is None else out * w


def reference(attn: CompressedAttention, x: torch.Tensor) -> torch.Tensor:
    """The formula above for one row ``x`` (T, D), no indexer."""
    T, m, W = x.shape[0], attn.compress_rate, attn.local_window
    kv = torch.stack([rope(rms(attn.kv.weight @ x[s], attn.kv_norm.weight), s) for s in range(T)])  # (T, HD)
    entries = []
    if m is not None:
        p = attn.pooler
        C, Z = x @ p.kv.weight.T, x @ p.gate.weight.T  # (T, series*HD)
        for b in range(T // m):
            if p.overlap:  # previous block's first half, then this block's second half
                slots = [(s, s - (b - 1) * m, slice(0, HD)) for s in range((b - 1) * m, b * m) if s >= 0]
                slots += [(s, s - b * m, slice(HD, 2 * HD)) for s in range(b * m, (b + 1) * m)]
            else:
                slots = [(s, s - b * m, slice(0, HD)) for s in range(b * m, (b + 1) * m)]
            c = torch.stack([C[s, part] for s, _, part in slots])  # (n, HD)
            z = torch.stack([Z[s, part] + p.slot_bias[j, part] for s, j, part in slots])
            entries.append(rope(rms((z.softmax(0) * c).sum(0), p.norm.weight), b * m))
    out = []
    for t in range(T):
        keys = [kv[s] for s in range(max(0, t - W + 1), t + 1)] + [entries[b] for b in range(len(entries)) if (b + 1) * m <= t + 1]
        keys = torch.stack(keys)  # (S, HD)
        q = (attn.q_b.weight @ rms(attn.q_a.weight @ x[t], attn.q_norm.weight)).view(H, HD)
        q = rope(rms(q), t)
        logits = q @ keys.T / HD ** 0.5  # (H, S)
        probs = torch.cat((logits, attn.sinks[:, None]), dim=1).softmax(-1)[:, :-1]
        o = rope(probs @ keys, -t).reshape(-1)  # (H*HD)
        if isinstance(attn.out, torch.nn.Linear):
            out.append(attn.out.weight @ o)
        else:  # each group of heads to its own rank channels, then the mix
            g, r = attn.out.groups, attn.out.rank
            narrowed = [attn.out.down[i * r:(i + 1) * r] @ part for i, part in enumerate(o.chunk(g))]
            out.append(attn.out.mix.weight @ torch.cat(narrowed))
    return torch.stack(out)


@pytest.mark.parametrize("changes", [
    {"compress_rate": 3},
    {"compress_rate": 2, "overlap": True},
    {"compress_rate": 2, "out_groups": 2, "out_rank": 4},
    {},
], ids=["pooled", "overlap", "grouped-output", "sliding-only"])
@torch.no_grad()
def test_matches_the_formula(changes: dict[str, Any]) -> None:
    attn, T = layer(**changes), 11
    x = torch.randn(2, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got = attn(x, context(T))
    for row in range(2):
        # The rope tables are float32 by design (angles of large positions), hence not 1e-12.
        torch.testing.assert_close(got[row], reference(attn, x[row]), rtol=1e-6, atol=1e-6)


# -- transformers' DeepSeek-V4 attention, the same weights --------------------------------------

def hf_pair(layer_type: str, *, topk: int = 2) -> tuple[Any, CompressedAttention]:
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Attention

    config = DeepseekV4Config(
        hidden_size=D, num_attention_heads=H, head_dim=HD, q_lora_rank=QR, partial_rotary_factor=ROPE / HD,
        num_hidden_layers=1, layer_types=[layer_type], sliding_window=4, o_groups=2, o_lora_rank=4,
        compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 3},
        index_n_heads=2, index_head_dim=8, index_topk=topk, rope_theta=10000.0, compress_rope_theta=160000.0,
        vocab_size=16, n_routed_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    theirs = DeepseekV4Attention(config, layer_idx=0).double().eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
    rate = {"sliding_attention": None, "compressed_sparse_attention": 2, "heavily_compressed_attention": 3}[layer_type]
    csa = layer_type == "compressed_sparse_attention"
    ours = layer(compress_rate=rate, overlap=csa, out_groups=2, out_rank=4,
                 **({"index_heads": 2, "index_head_dim": 8, "index_topk": topk} if csa else {}))
    names = {"q_a": "q_a_proj", "q_norm": "q_a_norm", "q_b": "q_b_proj", "kv": "kv_proj", "kv_norm": "kv_norm",
             "out.down": "o_a_proj", "out.mix": "o_b_proj", "pooler.kv": "compressor.kv_proj",
             "pooler.gate": "compressor.gate_proj", "pooler.norm": "compressor.kv_norm",
             "index_pooler.kv": "compressor.indexer.kv_proj", "index_pooler.gate": "compressor.indexer.gate_proj",
             "index_pooler.norm": "compressor.indexer.kv_norm", "index_q": "compressor.indexer.q_b_proj",
             "index_weights": "compressor.indexer.scorer.weights_proj"}
    state = theirs.state_dict()
    mapped = {}
    for name in ours.state_dict():
        if name == "sinks":
            mapped[name] = state["sinks"]
        elif name.endswith("slot_bias"):
            mapped[name] = state[("compressor.indexer" if name.startswith("index") else "compressor") + ".position_bias"]
        else:
            prefix, leaf = name.rsplit(".", 1)
            mapped[name] = state[names[prefix] + "." + leaf] if prefix in names else state[names[name] + ".weight"]
    ours.load_state_dict(mapped)
    return theirs, ours


@pytest.mark.parametrize("layer_type,topk", [
    ("sliding_attention", 2), ("heavily_compressed_attention", 2),
    ("compressed_sparse_attention", 2), ("compressed_sparse_attention", 64),
], ids=["sliding", "hca", "csa-top2", "csa-all"])
@torch.no_grad()
def test_matches_transformers_deepseek_v4_attention(layer_type: str, topk: int) -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4RotaryEmbedding

    theirs, ours = hf_pair(layer_type, topk=topk)
    B, T = 2, 13
    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    position_ids = torch.arange(T)[None].expand(B, T)
    rotary = DeepseekV4RotaryEmbedding(theirs.config)
    embeddings = {kind: rotary(x, position_ids, layer_type=kind) for kind in ("main", "compress")}
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    mask = torch.zeros(T, T, dtype=torch.float64).masked_fill((j > i) | (i - j >= 4), float("-inf"))
    want, _ = theirs(x, position_embeddings=embeddings, position_ids=position_ids,
                     attention_mask=mask.expand(B, 1, T, T), cache=None)
    theta = 10000.0 if layer_type == "sliding_attention" else 160000.0
    torch.testing.assert_close(ours(x, context(T, theta=theta)), want, rtol=1e-5, atol=1e-6)
