"""LFM2-MoE (``model_type: lfm2_moe``, Liquid AI's LFM2-8B-A1B): LFM2's hybrid layers with sigmoid-routed experts.

The mixers, norms, sizes and rope are LFM2's (:mod:`specformer_hf.families.lfm2`). The first
``num_dense_layers`` feed-forwards are LFM2's SwiGLU (``w1`` gate, ``w3`` up, ``w2`` down) of width
``intermediate_size`` as it is (no auto-adjusting); the others are a mixture of SwiGLU experts
(``feed_forward.experts.{j}.w1/w3/w2`` as saved, ``gate_up_proj`` / ``down_proj`` in memory) routed
by sigmoid scores: the top-k experts by score plus ``expert_bias`` (use_expert_bias false is refused),
their plain scores renormalised (norm_topk_prob) and multiplied by routed_scaling_factor -- our
``sigmoid_topk`` with the bias as its ``selection_bias``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families import lfm2
from specformer_hf.parts.base import FamilyView, Part
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.feedforward import expert_rules
from specformer_hf.parts.norms import RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible

#: transformers' Lfm2MoeConfig defaults (LFM2-8B-A1B's sizes but for its layer_types, which have no default).
DEFAULTS = {
    "vocab_size": 65536, "hidden_size": 2048, "intermediate_size": 7168, "moe_intermediate_size": 1792,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128_000,
    "norm_eps": 1e-5, "tie_word_embeddings": True, "conv_bias": False, "conv_L_cache": 3, "num_dense_layers": 2,
    "num_experts_per_tok": 4, "num_experts": 32, "use_expert_bias": True, "routed_scaling_factor": 1.0,
    "norm_topk_prob": True, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}

FFN = lfm2.FFN


@dataclass(frozen=True)
class Mixers(lfm2.Mixers):
    """LFM2's mixers; the config is written with layer_types alone (Lfm2MoeConfig has no full_attn_idxs)."""

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        del config["full_attn_idxs"]


def _swiglu(hidden: int) -> dict[str, Any]:
    return {"kind": "swiglu", "hidden": hidden, "activation": "silu"}


@dataclass(frozen=True)
class Lfm2MoeFFN(Part):
    """num_dense_layers, intermediate_size, num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob,
    routed_scaling_factor, use_expert_bias <-> dense SwiGLU first layers (``layers:`` overrides), then ffn moe with a
    ``sigmoid_topk`` router (no groups; expert_bias is its selection_bias)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        dense = min(cfg.get_int("num_dense_layers"), n_layers)
        # sigmoid_topk always has its selection bias; a router choosing by the plain scores has no tensor to read.
        cfg.require("use_expert_bias", (True,), why="specformer's sigmoid_topk router always keeps a selection bias "
                    "(expert_bias)")
        if dense == n_layers:  # no experts anywhere: the expert fields size nothing
            cfg.mark_read("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
                          "routed_scaling_factor")
            model.setdefault("block", {})["ffn"] = _swiglu(cfg.get_int("intermediate_size"))
            return
        model.setdefault("block", {})["ffn"] = {
            "kind": "moe", "n_experts": cfg.get_int("num_experts"), "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": cfg.get_int("moe_intermediate_size"), "activation": "silu", "gated": True,
            "router": {"kind": "sigmoid_topk", "normalize": bool(cfg.get("norm_topk_prob")),
                       "scaling_factor": cfg.get_float("routed_scaling_factor")},
            "aux_loss_coef": 0.0,  # transformers' LFM2-MoE has no auxiliary loss
        }
        if dense:
            model.setdefault("layers", []).append({"select": 0 if dense == 1 else f"0:{dense}",
                                                   "ffn": _swiglu(cfg.get_int("intermediate_size"))})
        else:
            cfg.mark_read("intermediate_size")  # only dense layers use it

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        ffns = view.per_layer("ffn")
        kinds = [f["kind"] for f in ffns]
        dense = [i for i, kind in enumerate(kinds) if kind != "moe"]
        if dense != list(range(len(dense))):
            raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name} has its dense layers first, then "
                                 "moe layers")
        for i in dense:
            ffn = ffns[i]
            if ffn["kind"] != "swiglu" or ffn.get("activation") != "silu" or ffn.get("bias"):
                raise NotExpressible(f"model.layers[{i}].ffn", f"Hugging Face {view.name}'s dense feed-forward is "
                                     "swiglu (silu) without biases")
        widths = {ffns[i]["hidden"] for i in dense}
        if len(widths) > 1:
            raise NotExpressible("model.layers[*].ffn.hidden", f"dense layers of widths {sorted(widths)}; Hugging Face "
                                 f"{view.name} has one intermediate_size")
        config.update(num_dense_layers=len(dense), use_expert_bias=True)
        if dense:
            config["intermediate_size"] = widths.pop()
        moe = [f for f in ffns if f["kind"] == "moe"]
        if not moe:
            return
        strip = lambda f: {k: v for k, v in f.items() if k != "aux_loss_coef"}  # noqa: E731
        if any(strip(f) != strip(moe[0]) for f in moe[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one "
                                 "expert setting")
        ffn, router = moe[0], moe[0].get("router") or {}
        if router.get("kind") != "sigmoid_topk" or router.get("bias") or router.get("n_group", 1) != 1:
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with sigmoid_topk (no "
                                 "groups, no score bias)")
        for key, wanted in (("activation", "silu"), ("gated", True), ("n_shared_experts", 0), ("expert_bias", False),
                            ("swiglu_limit", None)):
            if ffn.get(key, wanted) != wanted:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has "
                                     f"{wanted!r}")
        config.update(num_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], moe_intermediate_size=ffn["hidden"],
                      norm_topk_prob=router["normalize"], routed_scaling_factor=router["scaling_factor"])

    def rules(self) -> list[Rule]:
        return [*expert_rules(saved=FFN, fused=FFN, gate="w1", up="w3", down="w2"),
                Copy(f"{FFN}.expert_bias", "blocks.{i}.ffn.router.selection_bias"),
                *lfm2.Lfm2FFN().rules()]  # the dense first layers (a layer without such parameters skips them)


FAMILY = decoder_family(
    name="LFM2-MoE",
    model_type="lfm2_moe",
    architecture="Lfm2MoeForCausalLM",
    defaults=DEFAULTS,
    parts=[lfm2.Lfm2Sizes(), Rope(), lfm2.PreNorm(), RMSNorm(eps_key="norm_eps"), Mixers(), Lfm2MoeFFN()],
    maps="as LFM2 (layer_types as short_conv and attention layers, pre-norm RMSNorm, rope); num_dense_layers SwiGLU "
         "first layers of width intermediate_size; then ffn moe (num_experts, num_experts_per_tok, "
         "moe_intermediate_size) with router sigmoid_topk (norm_topk_prob, routed_scaling_factor; expert_bias is its "
         "selection_bias)",
    caveats="use_expert_bias false is refused (sigmoid_topk always keeps a selection bias); transformers divides the "
            "chosen weights by their sum + 1e-6 when renormalising, specformer by their sum + 1e-20 (a relative "
            "difference of 1e-6 / that sum)",
)
