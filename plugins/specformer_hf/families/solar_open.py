"""Solar Open (``model_type: solar_open``, Solar-Open-100B): Llama's attention (biases on q, k and v only) over GLM-4.5's
sigmoid-routed experts and shared expert in every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import FamilyView, Fixed, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, GroupedExperts
from specformer_hf.specview import NotExpressible

#: transformers' SolarOpenConfig defaults (Solar-Open-100B's sizes; its default_theta 1e6).
DEFAULTS = {
    "vocab_size": 196608, "hidden_size": 4096, "num_hidden_layers": 48, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False, "moe_intermediate_size": 1280,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0,
    "n_group": 1, "topk_group": 1, "norm_topk_prob": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}


@dataclass(frozen=True)
class EveryLayerExperts(GroupedExperts):
    """GLM-4.5's experts in every layer: SolarOpenConfig has no first_k_dense_replace (nor a dense width)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.data.get("first_k_dense_replace"):
            cfg.note_unused("first_k_dense_replace (transformers' Solar Open has experts in every layer)")
        cfg.data["first_k_dense_replace"] = 0
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if any(kind != "moe" for kind in view.per_layer("ffn", "kind")):
            raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name} has experts in every layer")
        super().write(view, config)
        del config["first_k_dense_replace"]


FAMILY = decoder_family(
    name="Solar Open",
    model_type="solar_open",
    architecture="SolarOpenForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, EveryLayerExperts(), instead_of=GatedFFN),
        Switch("attention_bias", ("mixer.qkv_bias",)),
        Fixed("mixer.out_bias", False, why="has no bias on o_proj (attention_bias is on q, k and v only)"),
    ],
    maps="as Llama (prenorm RMSNorm, rope, GQA, head_dim), attention_bias on q/k/v; ffn moe in every layer as "
         "GLM-4.5's: router sigmoid_topk (norm_topk_prob, routed_scaling_factor, n_group, topk_group; "
         "e_score_correction_bias -> selection_bias), n_shared_experts",
    caveats="every layer has experts (no first_k_dense_replace); the whole head is rotated (partial_rotary_factor "
            "is refused: transformers' attention cannot rotate part of a head); aux_loss_coef is 0 on import",
)
