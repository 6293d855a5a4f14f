"""GPT-NeoX Japanese (``model_type: gpt_neox_japanese``, ABEJA's GPT-NeoX Japanese 2.7B): sequential pre-norm
blocks with LayerNorms, GPT-NeoX's per-head fused qkv without biases, a partial rope, a bias-free MLP
``intermediate_multiple_size`` times as wide as the model, and a tied head.

The "dense bias" the last layer's attention returns is added to the attention output before the residual
(``bias_dropout_add``: residual + dropout(x + bias)); in eval mode that is an output-projection bias on that
layer alone, so it is read as ``out_bias`` on the last layer's mixer, and no other layer may have one.
"""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.parts.embedding import model_sizes, model_sizes_config, no_output_bias
from specformer_hf.parts.positions import check_rotary_dim, rope, rope_config
from specformer_hf.rules import Copy, HeadInterleavedQKV
from specformer_hf.specview import NotExpressible, SpecView

NAME = "GPT-NeoX Japanese"

#: transformers' GPTNeoXJapaneseConfig defaults (the 2.7B model's, its docstring says).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 2560, "num_hidden_layers": 32, "num_attention_heads": 32,
    "intermediate_multiple_size": 4, "hidden_act": "gelu", "max_position_embeddings": 2048, "layer_norm_eps": 1e-5,
    "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 1.0},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    n_heads = cfg.get_size("num_attention_heads")
    d_model = cfg.get_int("hidden_size")
    positional = rope(cfg, extra_legacy={"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"},
                      partial=True)
    check_rotary_dim(cfg, n_heads, positional)
    multiple = cfg.get("intermediate_multiple_size")
    n_layers = cfg.get_layers("num_hidden_layers")
    cfg.mark_read("hidden_dropout")  # dropout after the bias: training only
    return {
        **model_sizes(cfg),
        "positional": positional,
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_eps")},
            "mixer": {"kind": "attention", "n_heads": n_heads, "qkv_bias": False, "out_bias": False},
            "ffn": {"kind": "mlp", "hidden": int(d_model * multiple),
                    "activation": activation_from_hf(cfg, "hidden_act"), "bias": False},
        },
        # The last layer's attention adds its dense_bias.
        "layers": [{"select": [n_layers - 1], "mixer": {"out_bias": True}}],
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    no_output_bias(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    n_heads = view.multi_head(family=NAME)
    if view.uniform("mixer", "qkv_bias", family=NAME):
        raise NotExpressible("model.block.mixer.qkv_bias", f"Hugging Face {NAME}'s query_key_value has no bias")
    out_bias = view.per_layer("mixer", "out_bias")
    if out_bias != [False] * (m.n_layers - 1) + [True]:
        raise NotExpressible("model.layers[*].mixer.out_bias", f"Hugging Face {NAME} adds an attention output bias on "
                             f"the last layer only (got {out_bias})")
    if view.uniform("ffn", "bias", family=NAME):
        raise NotExpressible("model.block.ffn.bias", f"Hugging Face {NAME}'s MLP has no biases")
    hidden = view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model
    if hidden % m.d_model:
        raise NotExpressible("model.block.ffn.hidden", f"{hidden}: Hugging Face {NAME}'s MLP is "
                             f"intermediate_multiple_size (an integer) times d_model ({m.d_model}) wide")
    rotary = rope_config(view, NAME, legacy_theta="rotary_emb_base", partial=True)
    rotary["rope_parameters"].setdefault("partial_rotary_factor", 1.0)
    rotary.pop("rotary_emb_base", None)
    return {
        **model_sizes_config(view),
        "num_attention_heads": n_heads,
        "intermediate_multiple_size": hidden // m.d_model,
        "hidden_act": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "layer_norm_eps": view.uniform("norm", "eps", family=NAME),
        **rotary,
    }


FAMILY = Family(
    name=NAME,
    model_type="gpt_neox_japanese",
    architecture="GPTNeoXJapaneseForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=[
        Copy("gpt_neox_japanese.embed_in.weight", "embedding.weight"),
        Copy("gpt_neox_japanese.layers.{i}.input_layernorm.weight", "blocks.{i}.attention_norm.weight"),
        Copy("gpt_neox_japanese.layers.{i}.input_layernorm.bias", "blocks.{i}.attention_norm.bias"),
        Copy("gpt_neox_japanese.layers.{i}.post_attention_layernorm.weight", "blocks.{i}.ffn_norm.weight"),
        Copy("gpt_neox_japanese.layers.{i}.post_attention_layernorm.bias", "blocks.{i}.ffn_norm.bias"),
        HeadInterleavedQKV("gpt_neox_japanese.layers.{i}.attention.query_key_value.weight",
                           f"{BLOCK_MIXER}.qkv.weight"),
        Copy("gpt_neox_japanese.layers.{i}.attention.dense.weight", f"{BLOCK_MIXER}.out.weight"),
        # Only the last layer has it (and only its spec layer has out_bias): the other layers' rules find nothing.
        Copy("gpt_neox_japanese.layers.{i}.attention.dense_bias", f"{BLOCK_MIXER}.out.bias"),
        Copy("gpt_neox_japanese.layers.{i}.mlp.dense_h_to_4h.weight", "blocks.{i}.ffn.fc_in.weight"),
        Copy("gpt_neox_japanese.layers.{i}.mlp.dense_4h_to_h.weight", "blocks.{i}.ffn.fc_out.weight"),
        Copy("gpt_neox_japanese.final_layer_norm.weight", "final_norm.weight"),
        Copy("gpt_neox_japanese.final_layer_norm.bias", "final_norm.bias"),
        Copy("embed_out.weight", "lm_head.weight"),
    ],
    head_tensor="embed_out.weight",
    maps="prenorm LayerNorms, rope with partial_rotary_factor (rotary_pct, rotary_emb_base), query_key_value "
         "regrouped from per-head [q_h k_h v_h] to [q; k; v] without biases, the last layer's dense_bias as its "
         "attention out_bias, a bias-free MLP intermediate_multiple_size * hidden_size wide, tied or untied head",
    caveats="multi-head attention only; hidden_dropout (after the dense bias) is training only",
)
