"""GPT-NeoX / Pythia (``model_type: gpt_neox``): parallel attention and MLP, partial rotary, per-head fused qkv."""

from __future__ import annotations

from typing import Any

from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.parts.embedding import model_sizes, model_sizes_config, no_output_bias
from specformer_hf.parts.positions import check_rotary_dim, rope, rope_config
from specformer_hf.rules import Copy, HeadInterleavedQKV
from specformer_hf.specview import NotExpressible, SpecView

NAME = "GPT-NeoX"

#: transformers' GPTNeoXConfig defaults.
DEFAULTS = {
    "vocab_size": 50432, "hidden_size": 6144, "num_hidden_layers": 44, "num_attention_heads": 64,
    "intermediate_size": 24576, "hidden_act": "gelu", "max_position_embeddings": 2048, "layer_norm_eps": 1e-5,
    "tie_word_embeddings": False, "use_parallel_residual": True, "attention_bias": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    bias = bool(cfg.get("attention_bias"))
    n_heads = cfg.get_size("num_attention_heads")
    positional = rope(cfg, extra_legacy={"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"},
                             partial=True)
    check_rotary_dim(cfg, n_heads, positional)
    parallel = bool(cfg.get("use_parallel_residual"))
    return {
        **model_sizes(cfg),
        "positional": positional,
        "block": {
            "layout": {"kind": "parallel", "shared_norm": False} if parallel else "prenorm",
            "norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_eps")},
            "mixer": {"kind": "attention", "n_heads": n_heads, "qkv_bias": bias, "out_bias": bias},
            "ffn": {"kind": "mlp", "hidden": cfg.get_int("intermediate_size"),
                    "activation": activation_from_hf(cfg, "hidden_act"), "bias": True},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    layout = view.block_kind("layout", ("parallel", "prenorm"), family=NAME)
    if layout == "parallel" and view.uniform("layout", "shared_norm", family=NAME):
        raise NotExpressible("model.block.layout.shared_norm", "GPT-NeoX's parallel blocks have two norms (GPT-J's one norm has no GPT-NeoX equivalent)")
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    rotary = rope_config(view, NAME, legacy_theta="rotary_emb_base", partial=True)
    rotary["rotary_pct"] = rotary["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    if "rope_scaling" in rotary:
        rotary["rope_scaling"]["partial_rotary_factor"] = rotary["rotary_pct"]
    return {
        **model_sizes_config(view),
        "num_attention_heads": view.uniform("mixer", "n_heads", family=NAME),
        "attention_bias": view.uniform("mixer", "qkv_bias", family=NAME),
        "use_parallel_residual": layout == "parallel",
        "intermediate_size": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,
        "hidden_act": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "layer_norm_eps": view.uniform("norm", "eps", family=NAME),
        **rotary,
    }


FAMILY = Family(
    name=NAME,
    model_type="gpt_neox",
    architecture="GPTNeoXForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=[
        Copy("gpt_neox.embed_in.weight", "embedding.weight"),
        Copy("gpt_neox.layers.{i}.input_layernorm.weight", "blocks.{i}.attention_norm.weight"),
        Copy("gpt_neox.layers.{i}.input_layernorm.bias", "blocks.{i}.attention_norm.bias"),
        Copy("gpt_neox.layers.{i}.post_attention_layernorm.weight", "blocks.{i}.ffn_norm.weight"),
        Copy("gpt_neox.layers.{i}.post_attention_layernorm.bias", "blocks.{i}.ffn_norm.bias"),
        HeadInterleavedQKV("gpt_neox.layers.{i}.attention.query_key_value.weight", f"{BLOCK_MIXER}.qkv.weight"),
        HeadInterleavedQKV("gpt_neox.layers.{i}.attention.query_key_value.bias", f"{BLOCK_MIXER}.qkv.bias"),
        Copy("gpt_neox.layers.{i}.attention.dense.weight", f"{BLOCK_MIXER}.out.weight"),
        Copy("gpt_neox.layers.{i}.attention.dense.bias", f"{BLOCK_MIXER}.out.bias"),
        Copy("gpt_neox.layers.{i}.mlp.dense_h_to_4h.weight", "blocks.{i}.ffn.fc_in.weight"),
        Copy("gpt_neox.layers.{i}.mlp.dense_h_to_4h.bias", "blocks.{i}.ffn.fc_in.bias"),
        Copy("gpt_neox.layers.{i}.mlp.dense_4h_to_h.weight", "blocks.{i}.ffn.fc_out.weight"),
        Copy("gpt_neox.layers.{i}.mlp.dense_4h_to_h.bias", "blocks.{i}.ffn.fc_out.bias"),
        Copy("gpt_neox.final_layer_norm.weight", "final_norm.weight"),
        Copy("gpt_neox.final_layer_norm.bias", "final_norm.bias"),
        Copy("embed_out.weight", "lm_head.weight"),
    ],
    head_tensor="embed_out.weight",
    # Old checkpoints carry the causal mask and rotary tables as buffers.
    ignore_tensors=(r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)",),
    maps="layout parallel with two LayerNorms (use_parallel_residual) or prenorm, rope with partial_rotary_factor "
         "(rotary_pct), query_key_value regrouped from per-head [q_h k_h v_h] to [q; k; v], GELU MLP with biases",
    caveats="multi-head attention only (no GQA in GPT-NeoX)",
)
