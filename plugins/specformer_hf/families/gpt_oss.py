"""gpt-oss (``model_type: gpt_oss``): attention with learned sinks and biases, alternating sliding and full layers,
YaRN rotary positions, and a mixture of clamped-SwiGLU experts with biases behind a biased top-k router."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, MLP, FamilyView, Part, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.windows import LayerTypes
from specformer_hf.rules import Copy, InterleavedGateUp, Rule, TransposedExperts
from specformer_hf.specview import NotExpressible

#: transformers' GptOssConfig defaults.
DEFAULTS = {
    "num_hidden_layers": 36, "num_local_experts": 128, "vocab_size": 201088, "hidden_size": 2880,
    "intermediate_size": 2880, "head_dim": 64, "num_attention_heads": 64, "num_key_value_heads": 8,
    "sliding_window": 128, "tie_word_embeddings": False, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "num_experts_per_tok": 4, "swiglu_alpha": 1.702, "swiglu_limit": 7.0,
    "router_aux_loss_coef": 0.001, "layer_types": None, "attention_bias": True,
    "rope_parameters": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                        "original_max_position_embeddings": 4096},
}


@dataclass(frozen=True)
class GptOssExperts(Part):
    """num_local_experts, num_experts_per_tok, intermediate_size, swiglu_limit and swiglu_alpha <-> ffn moe with
    expert biases and a biased softmax top-k router (top-k logits, then softmax over them: the renormalised top k)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.require("hidden_act", ("silu",), why="gpt-oss's experts are clamped SwiGLUs")
        model.setdefault("block", {})["ffn"] = {
            "kind": "moe",
            "n_experts": cfg.get_int("num_local_experts"),
            "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": cfg.get_int("intermediate_size"),
            "activation": "silu",
            "gated": True,
            "router": {"kind": "softmax_topk", "normalize": True, "bias": True},
            "expert_bias": True,
            "swiglu_limit": cfg.get_float("swiglu_limit"),
            "swiglu_alpha": cfg.get_float("swiglu_alpha"),
            "aux_loss_coef": cfg.get_float("router_aux_loss_coef"),
        }

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("ffn", ("moe",))
        ffn = view.uniform("ffn")
        router = ffn.get("router") or {}
        if router.get("kind") != "softmax_topk" or not router.get("bias") or not router.get("normalize"):
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name}'s router is "
                                 "{kind: softmax_topk, normalize: true, bias: true}")
        if not ffn["expert_bias"] or ffn["swiglu_limit"] is None or ffn["n_shared_experts"]:
            raise NotExpressible("model.block.ffn", f"Hugging Face {view.name}'s experts have biases and a clamped "
                                 "SwiGLU (expert_bias: true, swiglu_limit), and no shared experts")
        config.update(num_local_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], intermediate_size=ffn["hidden"],
                      swiglu_limit=ffn["swiglu_limit"], swiglu_alpha=ffn["swiglu_alpha"] or 1.702,
                      router_aux_loss_coef=ffn["aux_loss_coef"])

    def rules(self) -> list[Rule]:
        return [
            Copy(f"{MLP}.router.weight", "blocks.{i}.ffn.router.weight"),
            Copy(f"{MLP}.router.bias", "blocks.{i}.ffn.router.bias"),
            InterleavedGateUp(f"{MLP}.experts.gate_up_proj", "blocks.{i}.ffn.experts_in"),
            InterleavedGateUp(f"{MLP}.experts.gate_up_proj_bias", "blocks.{i}.ffn.experts_in_bias", bias=True),
            TransposedExperts(f"{MLP}.experts.down_proj", "blocks.{i}.ffn.experts_out"),
            Copy(f"{MLP}.experts.down_proj_bias", "blocks.{i}.ffn.experts_out_bias"),
        ]


@dataclass(frozen=True)
class Sinks(Part):
    """Every attention layer has learned per-head sink logits (``self_attn.sinks``)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {}).setdefault("mixer", {})["sinks"] = True

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if not view.uniform("mixer", "sinks"):
            raise NotExpressible("model.block.mixer.sinks", f"Hugging Face {view.name}'s attention always has sinks")

    def rules(self) -> list[Rule]:
        return [Copy(f"{ATTN}.sinks", f"{BLOCK_MIXER}.sinks")]


FAMILY = decoder_family(
    name="gpt-oss",
    model_type="gpt_oss",
    architecture="GptOssForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, GptOssExperts(), instead_of=GatedFFN),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Sinks(),
        # Even layers slide, odd layers see everything (GptOssConfig's default layer_types).
        LayerTypes(sliding=lambda i: (i + 1) % 2 == 1),
    ],
    maps="attention sinks, attention_bias (q, k, v, o), layer_types + sliding_window -> per-layer windows, rope (YaRN), "
         "ffn moe with a biased softmax top-k router, expert biases and the clamped SwiGLU (swiglu_limit, swiglu_alpha); "
         "the fused, interleaved gate_up_proj regrouped to [gate; up]",
    caveats="reads unquantized weights only (not the MXFP4 blocks of the published checkpoints)",
)
