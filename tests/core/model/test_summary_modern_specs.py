"""`specformer summary` on the real-shape specs of the 2024-25 families, against references written here.

For each spec the four figures a reader of ``summary`` relies on are checked against a
reference computed from the matching transformers model, built on the ``meta`` device
(no memory), and from its config:

* **total parameters**: the transformers model's parameter count.
* **active parameters per token**: total less, in every mixture-of-experts layer, the
  ``n_experts - top_k`` experts a token is not routed to (gate, up and down projections and
  their biases). Dense models: active = total.
* **forward FLOPs per token**: ``2 N + attention``. ``N`` is every parameter a token is
  multiplied by: the active parameters less the embedding lookup (the output projection
  stays; tied, the embedding matrix counts once, as the output projection) and less the
  residual-stream norms (``*norm*`` modules that are not inside attention; norms inside
  attention, Gemma's per-head q/k norms and MLA's latent norms, count as weights, as the
  summary counts them). The attention term per layer is ``2 H d_qk S`` for the scores plus
  ``2 H d_v S`` for the weighted sum, with ``S`` the context length, or the window on a
  sliding-window layer (Kaplan et al. 2020, section 2.1; PaLM, appendix B). For ordinary
  attention ``d_qk = d_v = head_dim`` (``4 H hd S``); for latent attention (DeepSeek-V2)
  ``d_qk = qk_nope_head_dim + qk_rope_head_dim`` and ``d_v = v_head_dim``.
* **KV-cache bytes per token**: what one more token adds to a cache that holds every
  token: ``2 x n_kv_heads x head_dim x dtype size`` per layer for keys and values;
  ``(kv_lora_rank + qk_rope_head_dim) x dtype size`` per layer for latent attention (the
  compressed latent and the one rotary key shared by all heads). Sliding-window layers are
  not capped in this figure (it is the growth per token); the figure "at full context"
  caps them at their window (chunked layers at their chunk), as the generate plugin's ring buffers do.
"""

from __future__ import annotations

import json

import pytest
import torch

import specformer
from specformer.cli.main import main

from conftest import SPECS
from fixtures.tiny import tiny_spec


ROPE_1M = {"rope_type": "default", "rope_theta": 1e6}

#: spec file -> (transformers config class, the real model's config fields that differ from the class defaults).
MODERN_SPECS = {
    "gemma-3-1b.yaml": ("Gemma3TextConfig", dict(
        vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, sliding_window=512, max_position_embeddings=32768)),
    "deepseek-v3.yaml": ("DeepseekV3Config", dict(
        max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
    "deepseek-v3.2.yaml": ("DeepseekV32Config", dict(
        max_position_embeddings=163840,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "original_max_position_embeddings": 4096,
                         "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0})),
    "gpt-oss-20b.yaml": ("GptOssConfig", dict(
        num_hidden_layers=24, num_local_experts=32, router_aux_loss_coef=0.9,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": False, "original_max_position_embeddings": 4096})),
    "qwen3-30b-a3b.yaml": ("Qwen3MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
        norm_topk_prob=True, max_position_embeddings=40960, tie_word_embeddings=False, rope_parameters=ROPE_1M)),
    "qwen1.5-moe-a2.7b.yaml": ("Qwen2MoeConfig", dict(
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, moe_intermediate_size=1408,
        shared_expert_intermediate_size=5632, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
        num_experts=60, num_experts_per_tok=4, max_position_embeddings=8192, tie_word_embeddings=False,
        rope_parameters=ROPE_1M)),
    "smollm3-3b.yaml": ("SmolLM3Config", dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=4, max_position_embeddings=65536, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 5e6})),
    "command-r7b.yaml": ("Cohere2Config", dict(
        vocab_size=256000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, logit_scale=0.25, max_position_embeddings=8192, sliding_window=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 50000.0})),
    "llama-4-scout-17b-16e.yaml": ("Llama4TextConfig", dict()),  # transformers' defaults are Scout's text model
    "stablelm-2-1.6b.yaml": ("StableLmConfig", dict(
        vocab_size=100352, hidden_size=2048, intermediate_size=5632, num_hidden_layers=24, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, use_qkv_bias=True, tie_word_embeddings=False)),
    "glm-4.5-air.yaml": ("Glm4MoeConfig", dict(
        head_dim=128, attention_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5})),
    "minimax-m2.yaml": ("MiniMaxM2Config", dict(rotary_dim=64)),
    "olmo-3-7b.yaml": ("Olmo3Config", dict(
        vocab_size=100278, max_position_embeddings=65536, rms_norm_eps=1e-6,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 5e5},
                         "full_attention": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 8.0, "beta_fast": 32.0,
                                            "beta_slow": 1.0, "original_max_position_embeddings": 8192,
                                            "attention_factor": 1.2079441541679836}})),
    "exaone-4.0-32b.yaml": ("Exaone4Config", dict(
        hidden_size=5120, intermediate_size=27392, num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8,
        head_dim=128, max_position_embeddings=131072, sliding_window=4096, sliding_window_pattern="LLLG",
        layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 16,
        rope_parameters={"rope_type": "llama3", "rope_theta": 1e6, "factor": 16.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
}


def reference(name: str) -> dict[str, int]:
    """The four figures of ``name``'s spec, from transformers' model of the same config."""
    import transformers

    class_name, fields = MODERN_SPECS[name]
    config = getattr(transformers, class_name)(**fields)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in hf.parameters())  # tied embeddings counted once

    # Active: the experts a token is not routed to are idle.
    n_experts = getattr(config, "num_experts", None) or getattr(config, "n_routed_experts", None) \
        or getattr(config, "num_local_experts", None)
    idle = 0
    for layer in hf.model.layers:
        ffn = layer.mlp if hasattr(layer, "mlp") else layer.feed_forward  # Llama 4 names it feed_forward
        experts = getattr(ffn, "experts", None)
        if experts is not None:  # a dense layer has none
            per_expert = sum(p.numel() for p in experts.parameters()) // n_experts
            idle += (n_experts - config.num_experts_per_tok) * per_expert
    active = total - idle

    # 2N: every weight a token is multiplied by.
    residual_norms = sum(
        p.numel() for module_name, module in hf.named_modules()
        if "norm" in module_name.rsplit(".", 1)[-1] and "self_attn" not in module_name
        for p in module.parameters(recurse=False)
    )
    lookup = 0 if config.tie_word_embeddings else hf.model.embed_tokens.weight.numel()
    weights = active - lookup - residual_norms

    # Attention: scores (d_qk) and weighted sum (d_v) over the span each layer sees.
    context = config.max_position_embeddings
    heads = config.num_attention_heads
    if hasattr(config, "kv_lora_rank"):  # latent attention
        d_qk, d_v = config.qk_nope_head_dim + config.qk_rope_head_dim, config.v_head_dim
        cache_elements_per_layer = config.kv_lora_rank + config.qk_rope_head_dim
    else:
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        d_qk = d_v = head_dim
        cache_elements_per_layer = 2 * config.num_key_value_heads * head_dim
    layer_types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
    # A sliding layer reads its window, a chunked one (Llama 4) at most its chunk.
    reach = {"sliding_attention": getattr(config, "sliding_window", None),
             "chunked_attention": getattr(config, "attention_chunk_size", None)}
    spans = [min(reach[kind], context) if reach.get(kind) else context for kind in layer_types]
    attention = sum(2 * heads * (d_qk + d_v) * span for span in spans)
    if hasattr(config, "index_topk"):  # DeepSeek Sparse Attention: the indexer scores every key, attention reads topk
        cache_elements_per_layer += config.index_head_dim
        attention = sum(2 * heads * (d_qk + d_v) * min(span, config.index_topk)
                        + 2 * config.index_n_heads * config.index_head_dim * span for span in spans)

    return {
        "total_params": total,
        "active_params": active,
        "forward_flops_per_token": 2 * weights + attention,
        "kv_cache_bytes_per_token_bf16": 2 * cache_elements_per_layer * config.num_hidden_layers,
        "kv_cache_bytes_per_token_fp32": 4 * cache_elements_per_layer * config.num_hidden_layers,
        "kv_cache_bytes_at_context_bf16": sum(2 * cache_elements_per_layer * span for span in spans),
    }


@pytest.fixture(scope="module")
def references() -> dict[str, dict[str, int]]:
    return {}


@pytest.mark.parametrize("name", sorted(MODERN_SPECS))
def test_summary_figures_equal_the_references(name, capsys, references):
    want = references.setdefault(name, reference(name))
    assert main(["summary", str(SPECS / name), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert {key: got.get(key) for key in want} == want


@pytest.mark.parametrize("name", sorted(MODERN_SPECS))
def test_the_table_prints_the_four_figures(name, capsys, references):
    from specformer.messages import format_bytes

    want = references.setdefault(name, reference(name))
    assert main(["summary", str(SPECS / name)]) == 0
    table = capsys.readouterr().out
    rows = {line.split("  ")[0].strip(): line for line in table.splitlines() if "  " in line}
    assert f"{want['total_params']:,}" in rows["total"]
    if want["active_params"] != want["total_params"]:
        assert f"{want['active_params']:,}" in rows["active / token"]
    else:
        assert "active / token" not in rows  # dense: every parameter is active
    flops = want["forward_flops_per_token"]
    printed = f"{flops / 1e12:.2f}T" if flops >= 1e12 else f"{flops / 1e9:.2f}G"
    assert printed in rows["forward FLOPs / token"]
    assert format_bytes(want["kv_cache_bytes_per_token_bf16"]) + " bf16" in rows["KV cache / token"]
    assert format_bytes(want["kv_cache_bytes_at_context_bf16"]) + " bf16" in rows["KV cache at full context"]



def test_the_cache_at_full_context_is_what_generate_allocates():
    """The capped figure equals the generate plugin's cache for one sequence of context_length tokens."""
    from specformer.model.attention import cache_slots_of
    from specformer_generate.cache import StaticKVCache

    spec = tiny_spec(
        vocab_size=64, n_layers=6, context_length=48,
        block={"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": 16}, "ffn": "swiglu"},
        layers=[
            {"select": "2::3", "mixer": {"window": None}},  # layers 2 and 5 global
            {"select": "4", "mixer": {"kind": "mla", "n_heads": 2, "kv_lora_rank": 12, "qk_rope_head_dim": 4,
                                      "qk_nope_head_dim": 6, "v_head_dim": 10, "window": 8}},
        ])
    model = specformer.build(spec, seed=0)
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=model.context_length, dtype=torch.bfloat16)
    slots = cache.slot_counts()  # tokens each layer's buffers hold: 16 on windowed layers, 8 on the mla one, 48 on global
    assert sorted(set(slots.values())) == [8, 16, 48]
    per_token = {i: cache_slots_of(a).bytes_per_token(2) for i, a in enumerate(model.attention_modules())}
    s = specformer.summarize(model)
    assert s.kv_bytes_at_context(torch.bfloat16) == sum(slots[i] * per_token[i] for i in slots)
    assert s.kv_bytes_per_token(torch.bfloat16) == sum(per_token.values())


def test_gemma4_counts_only_the_layers_that_keep_keys_and_values(capsys):
    """Gemma 4 E2B: the 20 layers transformers marks "reuse" (kv_sharing_modes) keep nothing; each other layer keeps
    2 x n_kv_heads x head_dim per token, with its own heads (per_layer_config: the global layers' 512 channels)."""
    import transformers

    config = transformers.Gemma4TextConfig(
        vocab_size=262144, hidden_size=1536, intermediate_size=6144, num_hidden_layers=35, num_attention_heads=8,
        num_key_value_heads=1, head_dim=256, global_head_dim=512, sliding_window=512, hidden_size_per_layer_input=256,
        num_kv_shared_layers=20, use_double_wide_mlp=True, final_logit_softcapping=30.0,
        layer_types=(["sliding_attention"] * 4 + ["full_attention"]) * 7)
    keeping = [i for i, mode in enumerate(config.kv_sharing_modes) if mode != "reuse"]
    per_token = sum(2 * config.per_layer_config[i].num_key_value_heads * config.per_layer_config[i].head_dim
                    for i in keeping)
    spans = [config.sliding_window if config.layer_types[i] == "sliding_attention" else config.max_position_embeddings
             for i in keeping]
    at_context = sum(2 * config.per_layer_config[i].num_key_value_heads * config.per_layer_config[i].head_dim * span
                     for i, span in zip(keeping, spans))
    assert main(["summary", str(SPECS / "gemma-4-e2b.yaml"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert (len(keeping), got["kv_shared_layers"]) == (15, 20)
    assert got["kv_cache_bytes_per_token_bf16"] == 2 * per_token == 18_432
    assert got["kv_cache_bytes_at_context_bf16"] == 2 * at_context
    assert main(["summary", str(SPECS / "gemma-4-e2b.yaml")]) == 0
    assert "18.0 KiB bf16  (20 of 35 layers read another layer's keys and values: no cache of their own)" in \
        capsys.readouterr().out
