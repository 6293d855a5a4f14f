"""Kolibri-1 (``model_type: kolibri1``, Aleph-Alpha/Kolibri-1): EXAONE 4's attention in GLM-4's sandwich blocks over
sigmoid-routed experts whose selection bias is added to the raw router logits, with one shared expert.

The attention normalises each query and key head (RMSNorm) and, in a model with windows, puts the
rope on the sliding layers only (the global ones, every fifth by default, have no positions). Each
block normalises the attention's and the MoE's output before the residual add (GLM-4's
``post_self_attn_layernorm`` and ``post_mlp_layernorm``). The router picks the top
``num_experts_per_tok`` of ``x W^T + e_score_correction_bias`` (our ``sigmoid_topk`` with
``bias_on: logit``), weighs them by the sigmoid of their logits, renormalised with
``norm_topk_prob``; a SwiGLU shared expert ``shared_expert_intermediate_size`` wide is always added.

Checkpoints name the post norms ``post_attn_norm`` / ``post_ffn_norm`` and the selection bias
``moe.router.expert_bias`` (transformers renames them on load and back on save); both spellings are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.families.glm4 import SANDWICH_NAMES
from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import LAYER, MLP, FamilyView, Part
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, expert_rules, shared_halves
from specformer_hf.parts.norms import Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.windows import SlidingRopeGlobalNope
from specformer_hf.rules import Copy, Fused, OneOf, Rule
from specformer_hf.specview import NotExpressible

#: transformers' Kolibri1Config defaults (Kolibri-1's sizes, its docstring's checkpoint).
DEFAULTS = {
    "vocab_size": 128000, "hidden_size": 2560, "num_hidden_layers": 50, "num_attention_heads": 48,
    "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": 513, "layer_types": None,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512, "num_experts_per_tok": 6,
    "num_experts": 384, "norm_topk_prob": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

#: The router as Kolibri-1 has it: no groups, no scaling, no score bias, the selection bias on the logits.
ROUTER = {"kind": "sigmoid_topk", "n_group": 1, "topk_group": 1, "scaling_factor": 1.0, "bias": False,
          "bias_on": "logit"}


#: The post norms as checkpoints name them -> as transformers names them in memory (GLM-4's names).
SAVED_POST_NORMS = {"post_attn_norm": "post_self_attn_layernorm", "post_ffn_norm": "post_mlp_layernorm"}


@dataclass(frozen=True)
class KolibriLayout(Layout):
    """GLM-4's sandwich layout, its post norms read under the checkpoints' names or transformers' in-memory ones."""

    kind: str = "sandwich"
    names: tuple[tuple[str, str], ...] = SANDWICH_NAMES

    def rules(self) -> list[Rule]:
        memory = dict((hf, ours) for ours, hf in self.names)
        rules: list[Rule] = [rule for rule in super().rules()
                             if not any(f".{hf}." in rule.hf[0] for hf in SAVED_POST_NORMS.values())]
        return rules + [OneOf(Copy(f"{LAYER}.{saved}.weight", f"blocks.{{i}}.{memory[hf]}.weight"),
                              Copy(f"{LAYER}.{hf}.weight", f"blocks.{{i}}.{memory[hf]}.weight"))
                        for saved, hf in SAVED_POST_NORMS.items()]


@dataclass(frozen=True)
class KolibriExperts(Part):
    """num_experts (num_local_experts), num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
    shared_expert_intermediate_size <-> ffn moe in every layer, router ``sigmoid_topk`` with ``bias_on: logit``,
    one ungated shared expert."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        count = "num_local_experts" if cfg.has("num_local_experts") else "num_experts"  # Kolibri1Config's attribute_map
        cfg.mark_read("num_local_experts", "num_experts")
        router = {"kind": "sigmoid_topk", "normalize": bool(cfg.get("norm_topk_prob")), "bias_on": "logit"}
        model.setdefault("block", {})["ffn"] = {
            "kind": "moe", "n_experts": cfg.get_int(count), "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": cfg.get_int("moe_intermediate_size"), "activation": activation_from_hf(cfg, "hidden_act"),
            "router": router, "n_shared_experts": 1, "shared_hidden": cfg.get_int("shared_expert_intermediate_size"),
            "aux_loss_coef": 0.0,  # balanced through the selection bias; transformers' Kolibri-1 adds no loss
        }

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if set(view.per_layer("ffn", "kind")) != {"moe"}:
            raise NotExpressible("model.layers[*].ffn.kind", f"Hugging Face {view.name} has experts in every layer")
        ffn, router = view.view.layers[0]["ffn"], view.view.layers[0]["ffn"].get("router") or {}
        strip = lambda f: {k: v for k, v in f.items() if k != "aux_loss_coef"}  # noqa: E731
        if any(strip(layer["ffn"]) != strip(ffn) for layer in view.view.layers[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one setting")
        if any(router.get(k, v if k != "kind" else None) != v for k, v in ROUTER.items()):
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with sigmoid_topk, its "
                                 "selection bias on the logits (bias_on: logit), no groups, scaling_factor 1, no bias")
        if ffn.get("n_shared_experts") != 1 or ffn.get("shared_gate") or ffn.get("expert_bias"):
            raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has one ungated shared "
                                 "expert (n_shared_experts: 1, shared_gate: false) and no expert biases")
        config.update(num_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], moe_intermediate_size=ffn["hidden"],
                      shared_expert_intermediate_size=ffn.get("shared_hidden") or ffn["hidden"],
                      norm_topk_prob=router["normalize"], hidden_act=ACTIVATIONS_TO_HF[ffn["activation"]])

    def rules(self) -> list[Rule]:
        return [
            *expert_rules(saved=MLP),
            OneOf(Copy(f"{LAYER}.moe.router.expert_bias", "blocks.{i}.ffn.router.selection_bias"),
                  Copy(f"{MLP}.gate.e_score_correction_bias", "blocks.{i}.ffn.router.selection_bias")),
            Fused([f"{MLP}.shared_experts.gate_proj.weight", f"{MLP}.shared_experts.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{MLP}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
        ]


FAMILY = decoder_family(
    name="Kolibri-1",
    model_type="kolibri1",
    architecture="Kolibri1ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(replace_part(LLAMA_PARTS, KolibriLayout(), instead_of=Layout),
                                   SlidingRopeGlobalNope(rope_without_window=True, pattern=5), instead_of=Rope),
                      KolibriExperts(), instead_of=GatedFFN),
        QKNorm("head"),
    ],
    maps="GLM-4's sandwich norms (post_self_attn_layernorm, post_mlp_layernorm); qk_norm RMSNorm per head; layer_types "
         "(every fifth layer full by default) and sliding_window -> per-layer windows, rope on the sliding layers and "
         "positional none on the full ones (sliding_window null: rope on every layer); ffn moe in every layer: "
         "num_experts, num_experts_per_tok, moe_intermediate_size, router sigmoid_topk with bias_on logit "
         "(norm_topk_prob; e_score_correction_bias -> selection_bias), one shared expert of "
         "shared_expert_intermediate_size",
    caveats="no biases; the router's logits are computed in the model's dtype (transformers computes them in float32); "
            "aux_loss_coef is 0 on import",
)
