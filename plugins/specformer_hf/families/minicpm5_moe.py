"""MiniCPM5-MoE (``model_type: minicpm5_moe``, MiniCPM5-15B-A2.5B): Llama's attention with a sigmoid output gate (its
query projection holds each head's query then its gate) over DeepSeek-V3's experts, layers typed dense or sparse."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families.deepseek_v32 import LayerTypedExperts
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, FamilyView, Refuse, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.deltanet import GatedQuery
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.rules import Copy, OneOf, Rule
from specformer_hf.specview import NotExpressible

#: transformers' MiniCPM5MoeConfig defaults (MiniCPM5-15B-A2.5B's sizes; the rest from Glm4MoeConfig, which it extends).
DEFAULTS = {
    "vocab_size": 130560, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 28,
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 524288, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "moe_intermediate_size": 512, "num_experts_per_tok": 16, "n_shared_experts": 1, "n_routed_experts": 160,
    "routed_scaling_factor": 3.66, "n_group": 1, "topk_group": 1, "norm_topk_prob": True, "mlp_layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0},
}


@dataclass(frozen=True)
class GatedAttention(Attention):
    """Attention whose ``q_gate_proj`` (saved as ``q_proj``) holds, head by head, the query's channels then the output gate's (the gate's
    sigmoid scales each channel of the attention output before o_proj): ``output_gate: true``."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        model["block"]["mixer"]["output_gate"] = True

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if not view.uniform("mixer", "output_gate"):
            raise NotExpressible("model.block.mixer.output_gate", f"Hugging Face {view.name}'s attention always gates "
                                 "its output (output_gate: true)")
        super().write(view, config)

    def rules(self) -> list[Rule]:
        def gated(p: str) -> Rule:
            # save_pretrained writes the projection as q_proj; transformers' module (and a file saved from it as it
            # is) names it q_gate_proj.
            return OneOf(*(GatedQuery([f"{ATTN}.{x}.{p}" for x in (query, "k_proj", "v_proj")],
                                      (f"{BLOCK_MIXER}.qkv.{p}", f"{BLOCK_MIXER}.gate.{p}"))
                           for query in ("q_proj", "q_gate_proj")))

        return [
            gated("weight"),
            gated("bias"),
            Copy(f"{ATTN}.o_proj.weight", f"{BLOCK_MIXER}.out.weight"),
            Copy(f"{ATTN}.o_proj.bias", f"{BLOCK_MIXER}.out.bias"),
        ]


@dataclass(frozen=True)
class MlpLayerTypes(LayerTypedExperts):
    """DeepSeek-V3's experts, the dense layers named by mlp_layer_types alone (MiniCPM5MoeConfig has no
    first_k_dense_replace field: export leaves it out)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        # No field, but a config.json's first_k_dense_replace fills mlp_layer_types in when that is absent (default 1).
        cfg.data.setdefault("first_k_dense_replace", 1)
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        del config["first_k_dense_replace"]


FAMILY = decoder_family(
    name="MiniCPM5-MoE",
    model_type="minicpm5_moe",
    architecture="MiniCPM5MoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(LLAMA_PARTS, GatedAttention(), instead_of=Attention), MlpLayerTypes(),
                      instead_of=GatedFFN),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Refuse("use_gated_attention", (None, True), optional=True,
               why="transformers' MiniCPM5-MoE always gates its attention output"),
    ],
    maps="as Llama (prenorm RMSNorm, rope, GQA, head_dim, attention_bias on q, k, v, o and the gate) with "
         "output_gate: q_gate_proj (each head's query, then its gate) -> qkv and gate; ffn moe as DeepSeek-V3's: "
         "router sigmoid_topk (norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias -> "
         "selection_bias), n_shared_experts; mlp_layer_types (or first_k_dense_replace) -> dense first layers",
    caveats="dense layers must come first in mlp_layer_types; aux_loss_coef is 0 on import",
)
