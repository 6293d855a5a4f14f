"""Mixtral (``model_type: mixtral``): Mistral's attention with a top-k routed mixture of SwiGLU experts."""

from __future__ import annotations

from typing import Any

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.family import Family
from specformer_hf.families import common
from specformer_hf.rules import Copy, PerExpert, Site
from specformer_hf.specview import NotExpressible, SpecView

NAME = "Mixtral"

#: transformers' MixtralConfig defaults.
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "sliding_window": None, "num_experts_per_tok": 2, "num_local_experts": 8, "router_aux_loss_coef": 0.001,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
}


def to_spec(cfg: ConfigReader) -> dict[str, Any]:
    return {
        **common.model_sizes(cfg),
        "positional": common.rope(cfg),
        "block": {
            "layout": "prenorm",
            "norm": common.rmsnorm(cfg),
            "attention": {**common.attention_sizes(cfg), "window": cfg.get("sliding_window")},
            "ffn": {
                "kind": "moe",
                "n_experts": cfg.get_int("num_local_experts"),
                "top_k": cfg.get_int("num_experts_per_tok"),
                "hidden": cfg.get_int("intermediate_size"),
                "activation": activation_from_hf(cfg, "hidden_act"),
                "gated": True,
                "routing": "softmax_then_topk",
                "normalize_topk": True,
                "aux_loss_coef": cfg.get_float("router_aux_loss_coef"),
            },
        },
    }


def to_config(view: SpecView) -> dict[str, Any]:
    common.no_output_bias(view, NAME)
    view.block_kind("layout", ("prenorm",), family=NAME)
    view.block_kind("ffn", ("moe",), family=NAME)
    ffn = view.uniform("ffn", None, family=NAME)
    if ffn["n_shared_experts"]:
        raise NotExpressible("model.block.ffn.n_shared_experts", "Hugging Face Mixtral has no shared experts")
    return {
        **common.model_sizes_config(view),
        **common.attention_sizes_config(view, NAME),
        "sliding_window": view.uniform("attention", "window", family=NAME),
        "num_local_experts": ffn["n_experts"],
        "num_experts_per_tok": ffn["top_k"],
        "intermediate_size": ffn["hidden"] or common.default_gated_hidden(view.model.d_model),
        "hidden_act": ACTIVATIONS_TO_HF[ffn["activation"]],
        "router_aux_loss_coef": ffn["aux_loss_coef"],
        **common.rmsnorm_config(view, NAME),
        **common.rope_config(view, NAME),
    }


def _experts(site: Site) -> int:
    return site.ffn.n_experts


_MOE = "model.layers.{i}.block_sparse_moe"

FAMILY = Family(
    name=NAME,
    model_type="mixtral",
    architecture="MixtralForCausalLM",
    defaults=DEFAULTS,
    to_spec=to_spec,
    to_config=to_config,
    weights=common.prenorm_rules() + common.llama_rules(mlp=None) + [
        Copy(f"{_MOE}.gate.weight", "blocks.{i}.ffn.router.weight"),
        # Expert j's w1 (gate) and w3 (up) stack into experts_in[j] = [gate; up]; w2 (down) into experts_out[j].
        PerExpert([_MOE + ".experts.{j}.w1.weight", _MOE + ".experts.{j}.w3.weight"], "blocks.{i}.ffn.experts_in", n_experts=_experts),
        PerExpert([_MOE + ".experts.{j}.w2.weight"], "blocks.{i}.ffn.experts_out", n_experts=_experts),
    ],
    maps="as Mistral with ffn moe: num_local_experts, num_experts_per_tok, softmax-then-top-k routing renormalised "
         "(Mixtral's router), SwiGLU experts (w1/w3/w2 per expert), router_aux_loss_coef -> aux_loss_coef",
    caveats="reads and writes the per-expert checkpoint layout transformers saves (block_sparse_moe.experts.j.w1/w2/w3)",
)
