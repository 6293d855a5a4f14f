"""Hunyuan 3 (``model_type: hy_v3``, ``HYV3ForCausalLM``): Qwen3's attention (an RMSNorm per query and key head) in
pre-norm blocks over DeepSeek-V3's sigmoid-routed experts without groups, after dense first layers.

The router scores every expert by sigmoid, picks the top ``num_experts_per_tok`` of the scores
plus ``e_score_correction_bias`` (our ``selection_bias``), always renormalises the chosen
scores and multiplies them by ``router_scaling_factor``; ``num_shared_experts`` shared experts
are one SwiGLU ``num_shared_experts * moe_intermediate_size`` wide. Checkpoints name the
router ``mlp.router.gate``, the bias ``mlp.expert_bias`` and the shared experts ``mlp.shared_mlp``
(transformers renames them on load and back on save); both spellings are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families.deepseek_v32 import LayerTypedExperts
from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import MLP, FamilyView, Part, Refuse, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, expert_rules, shared_halves
from specformer_hf.parts.mtp import LayerMTP
from specformer_hf.rules import Copy, Fused, OneOf, Rule
from specformer_hf.specview import NotExpressible

#: transformers' HYV3Config defaults (its docstring names tencent/Hy3-preview).
DEFAULTS = {
    "vocab_size": 120832, "hidden_size": 4096, "intermediate_size": 13312, "num_hidden_layers": 80,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "num_experts": 192, "num_experts_per_tok": 8, "num_shared_experts": 1,
    "moe_intermediate_size": 1536, "router_scaling_factor": 2.826, "enable_moe_fp32_combine": True,
    "mlp_layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 11_158_840.0},
}

#: HYV3Config's names for DeepSeek-V3's expert fields: (its name, the experts part's name).
EXPERT_NAMES = (("num_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts"),
                ("router_scaling_factor", "routed_scaling_factor"))
#: What DeepSeek-V3's router has that Hunyuan 3's fixes: renormalised top-k weights, no groups, no dense-first count.
FIXED = {"norm_topk_prob": True, "n_group": 1, "topk_group": 1}


@dataclass(frozen=True)
class HunyuanExperts(LayerTypedExperts):
    """DeepSeek-V3's experts under HYV3Config's names (num_experts, num_shared_experts, router_scaling_factor),
    always renormalised, no groups; dense layers by mlp_layer_types."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        for own, deepseek in EXPERT_NAMES:
            cfg.data[deepseek] = cfg.get(own)
        cfg.data.update(FIXED)
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        for key, wanted in FIXED.items():
            if config.pop(key) != wanted:
                raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name}'s sigmoid_topk router always "
                                     "renormalises the chosen weights and has no groups (normalize: true, n_group 1)")
        config.pop("first_k_dense_replace")  # HYV3Config has mlp_layer_types only
        for own, deepseek in EXPERT_NAMES:
            config[own] = config.pop(deepseek)

    def rules(self) -> list[Rule]:
        router, bias = "blocks.{i}.ffn.router.weight", "blocks.{i}.ffn.router.selection_bias"

        def shared(module: str) -> list[Rule]:
            return [Fused([f"{MLP}.{module}.gate_proj.weight", f"{MLP}.{module}.up_proj.weight"],
                          "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
                    Copy(f"{MLP}.{module}.down_proj.weight", "blocks.{i}.ffn.shared.down.weight")]

        saved, memory = shared("shared_mlp"), shared("shared_experts")
        return [
            # the checkpoints' names first (what save_pretrained writes), then transformers' in-memory ones
            OneOf(Copy(f"{MLP}.router.gate.weight", router), Copy(f"{MLP}.gate.weight", router)),
            OneOf(Copy(f"{MLP}.expert_bias", bias), Copy(f"{MLP}.e_score_correction_bias", bias)),
            *expert_rules(saved=MLP)[1:],
            *(OneOf(s, m) for s, m in zip(saved, memory)),
            *GatedFFN().rules(),  # the dense layers
        ]


FAMILY = decoder_family(
    name="Hunyuan 3",
    model_type="hy_v3",
    architecture="HYV3ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, HunyuanExperts(), instead_of=GatedFFN),
        QKNorm("head"),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Refuse("mlp_bias", (False,), why="it puts biases on the dense MLPs and shared experts, which specformer's "
                                         "DeepSeek-style experts have not"),
        # Its MTP layer names its norm before the head final_layernorm and keeps no copy of the embedding or head
        # (the engines that run it, vLLM's and LMDeploy's hy_v3_mtp, share the main model's).
        LayerMTP(final_norm="final_layernorm", copies=False),
    ],
    non_math_fields=("enable_moe_fp32_combine",),
    maps="as Qwen3 (prenorm RMSNorm, rope, GQA with head_dim, qk_norm RMSNorm per head, attention_bias) with ffn moe as "
         "DeepSeek-V3's: num_experts, num_experts_per_tok, moe_intermediate_size, router sigmoid_topk (always "
         "renormalised, router_scaling_factor; e_score_correction_bias / expert_bias -> selection_bias), "
         "num_shared_experts; mlp_layer_types -> dense first layers (intermediate_size); num_nextn_predict_layers -> mtp "
         "depths (model.layers.80: enorm, hnorm, eh_proj, final_layernorm and a decoder layer)",
    caveats="dense layers must come first in mlp_layer_types; mlp_bias must be false; enable_moe_fp32_combine (the "
            "shared experts added in float32) is not reproduced; a file without the multi-token-prediction layers "
            "its config counts imports without model.mtp, with a note; aux_loss_coef is 0 on import",
    ignore_tensors=(r"model\.layers\.80\..*",),
)
