"""GPTBigCode (``model_type: gpt_bigcode``, SantaCoder, StarCoder 1): GPT-2 with multi-query attention and nn.Linear weights."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.rules import Copy, HeadInterleavedQKV, Site
from specformer_hf.specview import NotExpressible, SpecView

NAME = "GPTBigCode"

#: transformers' GPTBigCodeConfig defaults.
DEFAULTS = {
    "vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None,
    "activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5, "scale_attn_weights": True,
    "multi_query": True, "add_cross_attention": False, "tie_word_embeddings": True,
}


class BigCodeQKV(HeadInterleavedQKV):
    """c_attn: with multi_query ``[q (all heads); k; v]`` (one key/value head), our order already;
    otherwise grouped per head ``[q_h; k_h; v_h]`` as GPT-NeoX's."""

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors) if site.mixer.n_kv_heads == 1 else super().to_ours(tensors, site)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors) if site.mixer.n_kv_heads == 1 else super().to_hf(tensors, site)


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("add_cross_attention", (False,), why="GPTBigCode with cross-attention is an encoder-decoder's decoder")
    d_model, n_heads = cfg.get_size("n_embd"), cfg.get_size("n_head")
    multi_query = cfg.require("multi_query", (True, False), why="it chooses one key/value head or one per query head")
    cfg.mark_read("num_key_value_heads")  # transformers derives it from multi_query, whatever the file says
    attention: dict[str, Any] = {"kind": "attention", "n_heads": n_heads, "n_kv_heads": 1 if multi_query else n_heads,
                                 "qkv_bias": True, "out_bias": True}
    if not cfg.get("scale_attn_weights"):
        attention["scale"] = 1.0
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": d_model,
        "n_layers": cfg.get_layers("n_layer"),
        "context_length": cfg.get_int("n_positions"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
        "positional": {"kind": "learned"},
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "layernorm", "eps": cfg.get_float("layer_norm_epsilon")},
            "mixer": attention,
            "ffn": {"kind": "mlp", "hidden": cfg.get("n_inner") or 4 * d_model,
                    "activation": activation_from_hf(cfg, "activation_function"), "bias": True},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    view.expect(view.positional, "model.positional", ("learned",), family=NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("layernorm",), family=NAME)
    view.block_kind("mixer", ("attention",), family=NAME)
    view.block_kind("ffn", ("mlp",), family=NAME)
    if m.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", f"Hugging Face {NAME} has no LM head bias")
    n_heads, n_kv, head_dim = view.attention_sizes()
    if n_kv not in (1, n_heads):
        raise NotExpressible("model.block.mixer.n_kv_heads", f"{n_kv} key/value heads: Hugging Face {NAME} has one "
                             f"(multi_query) or one per query head ({n_heads})")
    scale = view.uniform("mixer", "scale", family=NAME)
    if scale not in (None, 1.0, head_dim ** -0.5):
        raise NotExpressible("model.block.mixer.scale",
                             f"{scale}: Hugging Face {NAME} scales scores by 1/sqrt(head_dim) or not at all")
    return {
        "vocab_size": m.vocab_size,
        "n_positions": m.context_length,
        "n_embd": m.d_model,
        "n_layer": m.n_layers,
        "n_head": n_heads,
        "multi_query": n_kv == 1,
        "n_inner": view.uniform("ffn", "hidden", family=NAME) or 4 * m.d_model,
        "activation_function": ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=NAME)],
        "layer_norm_epsilon": view.uniform("norm", "eps", family=NAME),
        "scale_attn_weights": scale != 1.0 or head_dim == 1,
        "tie_word_embeddings": m.tie_embeddings,
    }


WEIGHTS = [
    Copy("transformer.wte.weight", "embedding.weight"),
    Copy("transformer.wpe.weight", "positional.table.weight"),
    Copy("transformer.h.{i}.ln_1.weight", "blocks.{i}.attention_norm.weight"),
    Copy("transformer.h.{i}.ln_1.bias", "blocks.{i}.attention_norm.bias"),
    BigCodeQKV("transformer.h.{i}.attn.c_attn.weight", f"{BLOCK_MIXER}.qkv.weight"),
    BigCodeQKV("transformer.h.{i}.attn.c_attn.bias", f"{BLOCK_MIXER}.qkv.bias"),
    Copy("transformer.h.{i}.attn.c_proj.weight", f"{BLOCK_MIXER}.out.weight"),
    Copy("transformer.h.{i}.attn.c_proj.bias", f"{BLOCK_MIXER}.out.bias"),
    Copy("transformer.h.{i}.ln_2.weight", "blocks.{i}.ffn_norm.weight"),
    Copy("transformer.h.{i}.ln_2.bias", "blocks.{i}.ffn_norm.bias"),
    Copy("transformer.h.{i}.mlp.c_fc.weight", "blocks.{i}.ffn.fc_in.weight"),
    Copy("transformer.h.{i}.mlp.c_fc.bias", "blocks.{i}.ffn.fc_in.bias"),
    Copy("transformer.h.{i}.mlp.c_proj.weight", "blocks.{i}.ffn.fc_out.weight"),
    Copy("transformer.h.{i}.mlp.c_proj.bias", "blocks.{i}.ffn.fc_out.bias"),
    Copy("transformer.ln_f.weight", "final_norm.weight"),
    Copy("transformer.ln_f.bias", "final_norm.bias"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="gpt_bigcode",
    architecture="GPTBigCodeForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    # Old checkpoints carry the causal mask as a buffer; base-model files have no "transformer." prefix.
    ignore_tensors=(r"(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)",),
    aliases=(("transformer.", ""),),
    # The softmax's precision under half-precision weights, and the settings of the inference runner the first
    # StarCoder configs were written for: none changes what the model computes.
    non_math_fields=("n_ctx", "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32", "inference_runner",
                     "max_batch_size", "max_sequence_length", "pad_key_length", "pre_allocate_kv_cache",
                     "validate_runner_input"),
    maps="learned positions (n_positions), LayerNorm, multi_query -> one key/value head (else one per head, c_attn "
         "regrouped from per-head [q_h k_h v_h]), scale_attn_weights, GELU MLP (n_inner) with biases",
    caveats="one key/value head or one per query head, nothing between",
)
