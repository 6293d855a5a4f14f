"""JetMoE (``model_type: jetmoe``): a mixture of attention heads and a mixture of SwiGLU experts in every layer.

Each layer routes a token twice, with the same expert count and top-k: to ``num_experts_per_tok``
of ``num_local_experts`` attention experts (a query and an output projection each, over keys and
values of ``num_key_value_heads`` heads of ``kv_channels`` shared by all: our ``moa`` mixer) and
to as many feed-forward experts (our ``moe``). Both routers take the softmax over the top-k
logits; both mixtures add one bias to their output. The blocks' RMSNorms use RMSNorm's default
eps 1e-6 whatever ``rms_norm_eps`` says (transformers builds them without it); only the final
norm reads it.
"""

from __future__ import annotations

from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER, LAYER
from specformer_hf.parts.embedding import model_sizes, model_sizes_config, no_output_bias
from specformer_hf.parts.positions import rope, rope_config
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible, SpecView

NAME = "JetMoE"

#: transformers' JetMoeConfig defaults (JetMoE-8B's sizes but 12 layers: specs/jetmoe-8b.yaml has 24).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 2048, "num_hidden_layers": 12, "num_key_value_heads": 16, "kv_channels": 128,
    "intermediate_size": 5632, "max_position_embeddings": 4096, "activation_function": "silu", "num_local_experts": 8,
    "num_experts_per_tok": 2, "aux_loss_coef": 0.01, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

#: The eps of the blocks' RMSNorms: transformers' JetMoeDecoderLayer builds them with RMSNorm's default.
BLOCK_EPS = 1e-6


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    n_experts, top_k = cfg.get_size("num_local_experts"), cfg.get_size("num_experts_per_tok")
    if top_k > n_experts:
        raise UserError(f"{cfg.family}: num_experts_per_tok ({top_k}) cannot exceed num_local_experts ({n_experts})")
    n_kv = cfg.get_size("num_key_value_heads")
    if cfg.has("num_attention_heads") and cfg.get("num_attention_heads") != n_kv * top_k:
        raise UserError(f"{cfg.family}: num_attention_heads ({cfg.get('num_attention_heads')}) must be "
                        f"num_key_value_heads * num_experts_per_tok ({n_kv * top_k}), as JetMoeConfig sets it")
    cfg.mark_read("num_attention_heads")  # derived by JetMoeConfig, saved beside the fields it comes from
    aux = cfg.get_float("aux_loss_coef")
    return {
        **model_sizes(cfg),
        "positional": rope(cfg),
        "final_norm": {"kind": "rmsnorm", "eps": cfg.get_float("rms_norm_eps")},
        "block": {
            "layout": "prenorm",
            "norm": {"kind": "rmsnorm", "eps": BLOCK_EPS},
            "mixer": {"kind": "moa", "n_experts": n_experts, "top_k": top_k, "n_kv_heads": n_kv,
                      "head_dim": cfg.get_size("kv_channels"), "out_bias": True, "aux_loss_coef": aux},
            "ffn": {"kind": "moe", "n_experts": n_experts, "top_k": top_k, "hidden": cfg.get_size("intermediate_size"),
                    "activation": activation_from_hf(cfg, "activation_function"), "gated": True,
                    "routing": "topk_then_softmax", "output_bias": True, "aux_loss_coef": aux},
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    no_output_bias(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("norm", ("rmsnorm",), family=NAME)
    view.block_kind("mixer", ("moa",), family=NAME)
    view.block_kind("ffn", ("moe",), family=NAME)
    if view.uniform("norm", "eps", family=NAME) != BLOCK_EPS:
        raise NotExpressible("model.block.norm.eps", f"Hugging Face {NAME}'s block RMSNorms always use eps {BLOCK_EPS}")
    view.expect(view.final_norm, "model.final_norm", ("rmsnorm",), family=NAME)
    mixer, ffn = view.uniform("mixer", family=NAME), view.uniform("ffn", family=NAME)
    if (mixer["n_experts"], mixer["top_k"]) != (ffn["n_experts"], ffn["top_k"]):
        raise NotExpressible("model.block.mixer.n_experts", f"Hugging Face {NAME} routes attention and feed-forward "
                             f"with one num_local_experts and num_experts_per_tok: the moa's and the moe's must match")
    if mixer["aux_loss_coef"] != ffn["aux_loss_coef"]:
        raise NotExpressible("model.block.mixer.aux_loss_coef", f"Hugging Face {NAME} has one aux_loss_coef for both "
                             f"routers")
    for key, wanted in (("router", None), ("out_bias", True), ("scale", None)):
        if mixer.get(key) != wanted:
            raise NotExpressible(f"model.block.mixer.{key}", f"{mixer.get(key)!r}: Hugging Face {NAME} has {wanted!r}")
    for key, wanted in (("router", None), ("routing", "topk_then_softmax"), ("gated", True), ("expert_bias", False),
                        ("swiglu_limit", None), ("n_shared_experts", 0), ("output_bias", True), ("output_norm", None)):
        if ffn.get(key) != wanted:
            raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {NAME} has {wanted!r}")
    if ffn["hidden"] is None:
        raise NotExpressible("model.block.ffn.hidden", f"Hugging Face {NAME} needs the experts' width (hidden)")
    head_dim = mixer["head_dim"] or view.model.d_model // mixer["n_kv_heads"]
    return {
        **model_sizes_config(view),
        **rope_config(view, NAME, legacy_theta=None),
        "rms_norm_eps": view.final_norm["eps"],
        "num_key_value_heads": mixer["n_kv_heads"],
        "kv_channels": head_dim,
        "num_attention_heads": mixer["n_kv_heads"] * mixer["top_k"],
        "num_local_experts": ffn["n_experts"],
        "num_experts_per_tok": ffn["top_k"],
        "intermediate_size": ffn["hidden"],
        "activation_function": ACTIVATIONS_TO_HF[ffn["activation"]],
        "aux_loss_coef": ffn["aux_loss_coef"],
    }


ATTN = f"{LAYER}.self_attention"
MLP = f"{LAYER}.mlp"

#: JetMoE stacks each mixture's experts as (experts, out, in), as ours are; kv_proj's rows are [k; v], as ours.
WEIGHTS: list[Rule] = [
    Copy("model.embed_tokens.weight", "embedding.weight"),
    Copy(f"{LAYER}.input_layernorm.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{ATTN}.experts.router.layer.weight", f"{BLOCK_MIXER}.router.weight"),
    Copy(f"{ATTN}.experts.input_linear.weight", f"{BLOCK_MIXER}.experts_q"),
    Copy(f"{ATTN}.experts.output_linear.weight", f"{BLOCK_MIXER}.experts_out"),
    Copy(f"{ATTN}.experts.bias", f"{BLOCK_MIXER}.out_bias"),
    Copy(f"{ATTN}.kv_proj.weight", f"{BLOCK_MIXER}.kv.weight"),
    Copy(f"{LAYER}.post_attention_layernorm.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{MLP}.router.layer.weight", "blocks.{i}.ffn.router.weight"),
    # input_linear's rows are [gate; up] (chunked in that order), as our experts_in's.
    Copy(f"{MLP}.input_linear.weight", "blocks.{i}.ffn.experts_in"),
    Copy(f"{MLP}.output_linear.weight", "blocks.{i}.ffn.experts_out"),
    Copy(f"{MLP}.bias", "blocks.{i}.ffn.output_bias"),
    Copy("model.norm.weight", "final_norm.weight"),
    Copy("lm_head.weight", "lm_head.weight"),
]

FAMILY = Family(
    name=NAME,
    model_type="jetmoe",
    architecture="JetMoeForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=WEIGHTS,
    non_math_fields=("output_router_logits", "attention_dropout"),
    maps="prenorm RMSNorms (eps 1e-6 in the blocks, rms_norm_eps on the final norm); rope (rope_parameters); mixer moa "
         "(num_local_experts, num_experts_per_tok, num_key_value_heads heads of kv_channels, the experts' shared bias); "
         "ffn moe with the same experts and top-k, intermediate_size, activation_function, softmax over the top-k "
         "logits, output_bias; aux_loss_coef on both",
    caveats="transformers' load-balancing loss is one over all layers' routers together, ours the sum of each "
            "router's own (training only); attention_dropout is not read",
)
