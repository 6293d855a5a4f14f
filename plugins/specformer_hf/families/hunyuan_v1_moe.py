"""Hunyuan-V1 MoE (``model_type: hunyuan_v1_moe``, Hunyuan-A13B): Hunyuan-V1's attention (q/k RMSNorm after RoPE)
over routed experts plus one always-on shared expert.

The router (``mlp.gate.wg``) is a softmax over every expert, the ``moe_topk`` best kept and
renormalised (computed in float32); the experts and the ungated shared expert (``mlp.shared_mlp``)
are SwiGLUs of width ``intermediate_size``, summed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_layers import default_gated_hidden

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.families.hunyuan_v1_dense import HUNYUAN_QK_NORM, AlphaRope
from specformer_hf.parts.base import MLP, FamilyView, Part, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, expert_rules, shared_halves
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, Fused, Rule
from specformer_hf.specview import NotExpressible

#: transformers' HunYuanMoEV1Config defaults.
DEFAULTS = {
    "vocab_size": 290943, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "num_experts": 1, "moe_topk": 1, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class HunyuanExperts(Part):
    """num_experts, moe_topk, intermediate_size (experts and shared expert alike) <-> ffn ``moe`` with softmax-then-top-k
    routing, always renormalised, and one ungated shared expert."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        hidden = cfg.get_int("intermediate_size")
        model.setdefault("block", {})["ffn"] = {
            "kind": "moe", "n_experts": cfg.get_int("num_experts"), "top_k": cfg.get_int("moe_topk"), "hidden": hidden,
            "activation": activation_from_hf(cfg, "hidden_act"), "gated": True,
            "routing": "softmax_then_topk", "normalize_topk": True, "aux_loss_coef": 0.0,
            "n_shared_experts": 1, "shared_hidden": hidden, "shared_gate": False,
        }

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("ffn", ("moe",))
        ffn = view.uniform("ffn")
        hidden = ffn["hidden"] or default_gated_hidden(view.model.d_model)
        wanted = {"routing": "softmax_then_topk", "normalize_topk": True, "gated": True, "n_shared_experts": 1,
                  "shared_gate": False, "expert_bias": False, "swiglu_limit": None, "router": None}
        for key, value in wanted.items():
            if ffn.get(key, value) != value:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has {value!r} "
                                     "(softmax top-k renormalised, one ungated shared expert)")
        if (ffn.get("shared_hidden") or hidden) != hidden:
            raise NotExpressible("model.block.ffn.shared_hidden", f"Hugging Face {view.name}'s shared expert is as wide "
                                 f"as each expert (intermediate_size {hidden})")
        config.update(num_experts=ffn["n_experts"], moe_topk=ffn["top_k"], intermediate_size=hidden,
                      hidden_act=ACTIVATIONS_TO_HF[ffn["activation"]])

    def rules(self) -> list[Rule]:
        return [
            Copy(f"{MLP}.gate.wg.weight", "blocks.{i}.ffn.router.weight"),
            *expert_rules(saved=MLP)[1:],
            Fused([f"{MLP}.shared_mlp.gate_proj.weight", f"{MLP}.shared_mlp.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{MLP}.shared_mlp.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
        ]


FAMILY = decoder_family(
    name="Hunyuan-V1 (MoE)",
    model_type="hunyuan_v1_moe",
    architecture="HunYuanMoEV1ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(LLAMA_PARTS, AlphaRope(), instead_of=Rope), HunyuanExperts(), instead_of=GatedFFN),
        HUNYUAN_QK_NORM,
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
    ],
    non_math_fields=("eod_token_id",),
    maps="as Hunyuan-V1 dense (prenorm RMSNorm, rope with NTK alpha, GQA, head_dim, qk_norm after RoPE, attention_bias) "
         "with ffn moe: num_experts, moe_topk, softmax over all experts then top-k renormalised (mlp.gate.wg), experts "
         "and one ungated shared expert (mlp.shared_mlp) of width intermediate_size",
    caveats="num_experts and moe_topk must be numbers (per-layer lists are refused); the router's float32 logits are "
            "computed in the model's dtype; reads per-expert and fused 3-D expert tensors, writes per-expert",
)
