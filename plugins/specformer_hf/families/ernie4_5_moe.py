"""ERNIE 4.5 MoE (``model_type: ernie4_5_moe``, ERNIE-4.5-21B-A3B, ERNIE-4.5-300B-A47B): dense ERNIE 4.5's attention
and interleaved rope, experts every ``moe_layer_interval`` layers between two indices (dense SwiGLU elsewhere) with
always-on shared experts, routed by a softmax whose top-k is chosen with a selection-only bias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_layers import default_gated_hidden

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.parts.base import MLP, FamilyView, Part, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.embedding import Sizes, model_sizes, model_sizes_config
from specformer_hf.parts.feedforward import GATED_KIND, GatedFFN, expert_rules, shared_halves
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, Fused, OneOf, Rule, Unsqueezed
from specformer_hf.specview import NotExpressible

#: transformers' Ernie4_5_MoeConfig defaults (its docstring: ERNIE-4.5-21B-A3B's sizes; default_theta 500000).
DEFAULTS = {
    "vocab_size": 103424, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 28,
    "num_attention_heads": 20, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "use_bias": False, "moe_intermediate_size": 1536, "moe_k": 6,
    "moe_num_experts": 64, "moe_num_shared_experts": 2, "moe_layer_start_index": 1, "moe_layer_end_index": -1,
    "moe_layer_interval": 1, "moe_norm_min": 1e-12, "router_aux_loss_coef": 0.001,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}

#: What the MoE layers' router must be for transformers' Ernie4_5_MoeTopKRouter (besides its kind and norm_min).
PLAIN_ROUTER = {"normalize": True, "scaling_factor": 1.0, "n_group": 1, "topk_group": 1, "bias": False}


def moe_layers(n_layers: int, *, start: int, end: int, interval: int) -> list[int]:
    """The layers Ernie4_5_MoeDecoderLayer makes sparse: every ``interval``-th (counted from 1) in ``start..end``."""
    return [i for i in range(n_layers) if (i + 1) % interval == 0 and start <= i <= end]


@dataclass(frozen=True)
class BiasedHead(Part):
    """Sizes, and use_bias's LM head bias: Ernie4_5_MoeForCausalLM gives its head one even when tied to the embedding."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        sizes = model_sizes(cfg)
        if cfg.get("use_bias") and sizes["tie_embeddings"]:
            raise UserError(f"{cfg.family}: use_bias with tie_word_embeddings is not supported: the LM head tied to the "
                            "embedding then has a bias of its own, not mapped by this family yet; supported: "
                            "use_bias false, or tie_word_embeddings false")
        model.update(sizes, lm_head_bias=bool(cfg.get("use_bias")))

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        biased = bool(view.uniform("mixer", "qkv_bias"))
        if view.model.lm_head_bias != biased:
            raise NotExpressible("model.lm_head_bias", f"Hugging Face {view.name}'s use_bias switches the LM head's bias "
                                 f"with the attention's (qkv_bias: {biased})")
        config.update(model_sizes_config(view.view))

    def rules(self) -> list[Rule]:
        return [*Sizes().rules(), Copy("lm_head.bias", "lm_head.bias")]


@dataclass(frozen=True)
class ErnieExperts(Part):
    """moe_num_experts, moe_k, moe_intermediate_size, moe_num_shared_experts, moe_norm_min, router_aux_loss_coef,
    moe_layer_start_index / end_index / interval <-> ffn moe with a biased_softmax_topk router on those layers
    (``layers:`` overrides make the others dense SwiGLU of intermediate_size, biased with use_bias)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        end = cfg.get_int("moe_layer_end_index")
        sparse = moe_layers(n_layers, start=cfg.get_int("moe_layer_start_index"),
                            end=n_layers - 1 if end == -1 else end,  # Ernie4_5_MoeConfig.__post_init__'s -1
                            interval=cfg.get_size("moe_layer_interval"))
        if not sparse:
            raise UserError(f"{cfg.family}: moe_layer_start_index, moe_layer_end_index and moe_layer_interval select no "
                            f"layer of {n_layers}: a model without experts is dense ERNIE 4.5 (model_type ernie4_5)")
        biased = bool(cfg.get("use_bias"))
        n_shared = cfg.get_int("moe_num_shared_experts") or 0
        if biased and n_shared:
            raise UserError(f"{cfg.family}: use_bias with moe_num_shared_experts > 0 is not supported: the shared experts "
                            "then have biases, and specformer's moe has none on its shared experts; supported: use_bias "
                            "false, or moe_num_shared_experts 0")
        activation = activation_from_hf(cfg, "hidden_act")
        ffn: dict[str, Any] = {
            "kind": "moe", "n_experts": cfg.get_int("moe_num_experts"), "top_k": cfg.get_int("moe_k"),
            "hidden": cfg.get_int("moe_intermediate_size"), "activation": activation,
            "router": {"kind": "biased_softmax_topk", "norm_min": cfg.get_float("moe_norm_min")},
            "aux_loss_coef": cfg.get_float("router_aux_loss_coef"),
        }
        if n_shared:
            ffn["n_shared_experts"] = n_shared  # each moe_intermediate_size wide: shared_hidden's default
        model.setdefault("block", {})["ffn"] = ffn
        dense = [i for i in range(n_layers) if i not in sparse]
        if dense:
            model.setdefault("layers", []).append({"select": dense[0] if len(dense) == 1 else dense, "ffn": {
                "kind": GATED_KIND.get(activation, "swiglu"), "hidden": cfg.get_int("intermediate_size"),
                "activation": activation, "bias": biased}})
        else:
            cfg.mark_read("intermediate_size")  # only dense layers use it
        # The multi-token prediction module is not part of the causal LM (transformers skips it too).
        cfg.mark_read("num_mtp_layers", "num_nextn_predict_layers")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        layers = view.view.layers
        sparse = [i for i, layer in enumerate(layers) if layer["ffn"]["kind"] == "moe"]
        dense = [i for i, layer in enumerate(layers) if layer["ffn"]["kind"] != "moe"]
        if not sparse:
            raise NotExpressible("model.block.ffn.kind", f"Hugging Face {view.name} needs mixture-of-experts layers (moe)")
        interval = next((n for n in range(1, len(layers) + 1)
                         if moe_layers(len(layers), start=sparse[0], end=sparse[-1], interval=n) == sparse), None)
        if interval is None:
            raise NotExpressible("model.layers[*].ffn.kind", f"moe on layers {sparse}: Hugging Face {view.name} has experts "
                                 "on every moe_layer_interval-th layer between two indices")
        ffn = layers[sparse[0]]["ffn"]
        if any(layers[i]["ffn"] != ffn for i in sparse[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one setting")
        router = ffn.get("router") or {}
        if router.get("kind") != "biased_softmax_topk" or any(router.get(k, v) != v for k, v in PLAIN_ROUTER.items()):
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with biased_softmax_topk "
                                 "(normalize: true, scaling_factor 1, no groups, no score bias)")
        for key, wanted in (("expert_bias", False), ("swiglu_limit", None), ("gated", True), ("shared_gate", False)):
            if ffn.get(key, wanted) != wanted:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has {wanted!r}")
        hidden = ffn["hidden"] or default_gated_hidden(view.model.d_model)
        n_shared = ffn.get("n_shared_experts", 0)
        if n_shared and (ffn.get("shared_hidden") or hidden * n_shared) != hidden * n_shared:
            raise NotExpressible("model.block.ffn.shared_hidden", f"Hugging Face {view.name}'s shared experts are "
                                 "n_shared_experts * hidden wide")
        config.update(moe_num_experts=ffn["n_experts"], moe_k=ffn["top_k"], moe_intermediate_size=hidden,
                      moe_num_shared_experts=n_shared, moe_norm_min=router.get("norm_min", 1e-12),
                      router_aux_loss_coef=ffn["aux_loss_coef"], hidden_act=ACTIVATIONS_TO_HF[ffn["activation"]],
                      moe_layer_start_index=sparse[0], moe_layer_end_index=sparse[-1], moe_layer_interval=interval)
        if dense:
            widths = {layers[i]["ffn"].get("hidden") or default_gated_hidden(view.model.d_model) for i in dense}
            if len(widths) > 1:
                raise NotExpressible("model.layers[*].ffn.hidden", f"dense layers of widths {sorted(widths)}; Hugging Face "
                                     f"{view.name} has one intermediate_size")
            config["intermediate_size"] = widths.pop()

    def rules(self) -> list[Rule]:
        # Hub files keep the bias at mlp.moe_statics (transformers renames it on load); memory at mlp.gate.moe_statics.
        return [
            *expert_rules(saved=MLP),
            OneOf(*(Unsqueezed(f"{MLP}.{at}moe_statics.e_score_correction_bias", "blocks.{i}.ffn.router.selection_bias")
                    for at in ("", "gate."))),
            Fused([f"{MLP}.shared_experts.gate_proj.weight", f"{MLP}.shared_experts.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{MLP}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
            *GatedFFN().rules(),  # the dense layers, biased with use_bias
        ]


FAMILY = decoder_family(
    name="ERNIE 4.5 MoE",
    model_type="ernie4_5_moe",
    architecture="Ernie4_5_MoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        # As dense ERNIE 4.5: adjacent channel pairs rotated over whole heads.
        *replace_part(replace_part(replace_part(LLAMA_PARTS, Rope(interleaved=True)), BiasedHead(), instead_of=Sizes),
                      ErnieExperts(), instead_of=GatedFFN),
        # use_bias also reaches the LM head (BiasedHead) and the dense layers' MLPs (ErnieExperts).
        Switch("use_bias", ("mixer.qkv_bias", "mixer.out_bias")),
    ],
    maps="as dense ERNIE 4.5 (interleaved rope over whole heads, theta default 500000) with ffn moe on every "
         "moe_layer_interval-th layer from moe_layer_start_index to moe_layer_end_index (dense SwiGLU of "
         "intermediate_size elsewhere): moe_num_experts, moe_k, moe_intermediate_size, moe_num_shared_experts, router "
         "biased_softmax_topk (moe_norm_min -> norm_min; e_score_correction_bias -> selection_bias), "
         "router_aux_loss_coef; use_bias -> biases on q, k, v, o, the dense MLPs and the LM head",
    caveats="use_bias is refused with tied embeddings (the tied head would have a bias) and with shared experts (they "
            "would have biases); the multi-token-prediction module (mtp*) is skipped as transformers skips it",
    ignore_tensors=(r"(.*\.)?mtp.*",),
)
