"""The shared-block mechanisms of Zamba2's hybrid layer against transformers' own Zamba2 (no zamba2 family yet).

A tiny Zamba2ForCausalLM (two alternating shared blocks, num_mem_blocks 2; per-use q/k/v and gate_up adapters;
per-use linear; mem RoPE) and the spec written here by hand with model.shared_blocks (input concat_embeddings,
output mixer_input, projection, adapters), weights copied name by name: logits equal to 1e-5 in float64, and
cached decoding equal to the full forward. The mapping here is what a zamba2 family would write as rules.
Zamba2's k/v adapters are 2 x d_model -> 2 x d_model, so they need n_kv_heads * head_dim == 2 x d_model (no GQA).
"""

from __future__ import annotations

import pytest
import torch

import specformer
from fixtures.caching import cached_logits

transformers = pytest.importorskip("transformers")


def test_zamba2_hybrid_layers_match_transformers() -> None:
    from transformers import Zamba2Config, Zamba2ForCausalLM

    torch.manual_seed(0)
    D, H, KV, R, I = 32, 2, 2, 4, 24
    types = ["linear_attention", "hybrid", "linear_attention", "hybrid", "hybrid", "linear_attention"]
    cfg = Zamba2Config(vocab_size=101, hidden_size=D, num_hidden_layers=len(types), layers_block_type=types,
                       mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=2, n_mamba_heads=4,
                       chunk_size=4, intermediate_size=I, hidden_act="silu", num_attention_heads=H,
                       num_key_value_heads=KV, num_mem_blocks=2, use_shared_attention_adapter=True, adapter_rank=R,
                       use_mem_rope=True, rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=64)
    hf = Zamba2ForCausalLM(cfg).double().eval()
    with torch.no_grad():  # adapters, per-use linears and norms away from their initial values
        for n, p in hf.named_parameters():
            if "adapter" in n or "linear" in n.split(".")[-2] or "norm" in n:
                p.normal_(0, 0.3) if "norm" not in n else p.uniform_(0.5, 1.5)
    hd = 2 * D // H
    hyb = [i for i, t in enumerate(types) if t == "hybrid"]
    mamba = {"kind": "mamba2", "n_heads": 4, "head_dim": 16, "state_size": 8, "n_groups": 2, "conv_kernel": 4,
             "conv_bias": True, "bias": False, "norm_eps": 1e-5, "chunk": 4, "dt_min": cfg.time_step_min}

    def shared() -> dict:
        return {"input": "concat_embeddings",
                "layout": {"kind": "prenorm", "mixer_pre_norm": False, "residual_scales": [0.0, 0.0]},
                "norm": {"kind": "rmsnorm", "eps": 1e-5},
                "mixer": {"kind": "attention", "n_heads": H, "n_kv_heads": KV, "head_dim": hd, "input_width": 2 * D,
                          "scale": (hd / 2) ** -0.5},
                "ffn": {"kind": "swiglu", "hidden": I}, "output": "mixer_input", "projection": True,
                "adapters": {"rank": R, "targets": {"mixer.qkv": {"inputs": 2 * D, "outputs": [2 * D, 2 * D, 2 * D]},
                                                     "ffn.gate_up": {"inputs": D, "outputs": [2 * I]}}}}

    # Shared block s0 at the 1st and 3rd hybrid layers, s1 at the 2nd (num_mem_blocks 2); the backbone is Mamba-2.
    spec = {"model": {"vocab_size": 101, "d_model": D, "n_layers": len(types), "context_length": 64,
                      "tie_embeddings": True, "positional": {"kind": "rope", "theta": 10000.0},
                      "block": {"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-5}, "mixer": mamba,
                                "ffn": "none"},
                      "final_norm": {"kind": "rmsnorm", "eps": 1e-5},
                      "shared_blocks": {"s0": shared(), "s1": shared()},
                      "layers": [{"select": [i for k, i in enumerate(hyb) if k % 2 == 0], "shared": "s0"},
                                 {"select": [i for k, i in enumerate(hyb) if k % 2 == 1], "shared": "s1"}]}}
    ours = specformer.build(spec, seed=0).double().eval()
    sd = hf.state_dict()
    new = {}
    new["embedding.weight"] = sd["model.embed_tokens.weight"]
    new["final_norm.weight"] = sd["model.final_layernorm.weight"]
    for i, t in enumerate(types):
        src = f"model.layers.{i}." + ("mamba_decoder." if t == "hybrid" else "")
        new[f"blocks.{i}.attention_norm.weight"] = sd[src + "input_layernorm.weight"]
        m = src + "mamba."
        new[f"blocks.{i}.mixer.in_proj.weight"] = sd[m + "in_proj.weight"]
        new[f"blocks.{i}.mixer.conv_weight"] = sd[m + "conv1d.weight"][:, 0]
        new[f"blocks.{i}.mixer.conv_bias"] = sd[m + "conv1d.bias"]
        new[f"blocks.{i}.mixer.out.weight"] = sd[m + "out_proj.weight"]
        for n in ("dt_bias", "A_log", "D", "norm.weight"):
            new[f"blocks.{i}.mixer.{n}"] = sd[m + n]
    for k, i in enumerate(hyb):  # the k-th hybrid layer: block k % 2 (stored at its first layer), adapters slot k
        b = f"s{k % 2}"
        src = f"model.layers.{hyb[k % 2]}.shared_transformer."
        a = src + "self_attn."
        new[f"shared_blocks.{b}.input_norm.weight"] = sd[src + "input_layernorm.weight"]
        new[f"shared_blocks.{b}.ffn_norm.weight"] = sd[src + "pre_ff_layernorm.weight"]
        new[f"shared_blocks.{b}.mixer.qkv.weight"] = torch.cat([sd[a + f"{x}_proj.weight"] for x in "qkv"])
        new[f"shared_blocks.{b}.mixer.out.weight"] = sd[a + "o_proj.weight"]
        new[f"shared_blocks.{b}.ffn.gate_up.weight"] = sd[src + "feed_forward.gate_up_proj.weight"]
        new[f"shared_blocks.{b}.ffn.down.weight"] = sd[src + "feed_forward.down_proj.weight"]
        u = f"shared_use_parts.{i}."
        new[u + "projection.weight"] = sd[f"model.layers.{i}.linear.weight"]
        for p, name in enumerate("qkv"):
            new[u + f"adapters.mixer.qkv.{p}.down.weight"] = sd[a + f"linear_{name}_adapter_list.{k}.0.weight"]
            new[u + f"adapters.mixer.qkv.{p}.up.weight"] = sd[a + f"linear_{name}_adapter_list.{k}.1.weight"]
        new[u + "adapters.ffn.gate_up.0.down.weight"] = sd[src + f"feed_forward.gate_up_proj_adapter_list.{k}.0.weight"]
        new[u + "adapters.ffn.gate_up.0.up.weight"] = sd[src + f"feed_forward.gate_up_proj_adapter_list.{k}.1.weight"]
    assert set(ours.state_dict()) == set(new)  # every tensor of ours comes from transformers' model
    ours.load_state_dict({**ours.state_dict(), **new}, strict=True)
    ids = torch.randint(0, 101, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
        logits, _ = cached_logits(ours, ids, prompt=5)
        torch.testing.assert_close(logits, ours(ids), rtol=1e-9, atol=1e-9)
