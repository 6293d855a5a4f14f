"""Laguna (``model_type: laguna``, poolside's Laguna XS.2): pre-norm blocks whose attention has a head count per layer,
an RMSNorm per query and key head and a softplus output gate (``g_proj``: one gate per head, or per channel), full and
sliding layers by layer_types with a partial rope per layer type, and sigmoid-routed experts with one ungated shared
expert beside the dense layers mlp_layer_types names.

transformers 5.25's LagunaTopKRouter bounds its logits to ``cap * tanh(logits / cap)`` where
moe_router_logit_softcapping is positive, scores them with a sigmoid, picks the top-k of the scores plus
``e_score_correction_bias`` and always renormalises the picked scores; the routed output is multiplied by
moe_routed_scaling_factor and the shared expert added: our sigmoid_topk router with ``selection_bias``,
``logit_softcap`` and ``scaling_factor``. LagunaAttention gates per head when ``gating`` is true or ``"per-head"``
and per channel otherwise (``"per-element"``, and false too). save_pretrained writes the shared expert as
``mlp.shared_expert.*`` and the selection bias as ``mlp.experts.e_score_correction_bias`` (its conversion mapping
renames them on load to the modules' ``shared_experts`` and ``gate.e_score_correction_bias``); both are read.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import Attention, QKNorm
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, MLP, FamilyView, Refuse, Switch, selection
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, MixtureOfExperts
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.windows import LayerTypeRopes
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible

#: LagunaConfig's defaults (poolside/laguna-XS.2's shapes, as its docstring names them).
DEFAULTS = {
    "vocab_size": 100352, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 40,
    "num_attention_heads": 48, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "sliding_window": 512, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "num_experts_per_tok": 8, "num_experts": 256,
    "router_aux_loss_coef": 0.001, "layer_types": None, "head_dim": 128, "attention_bias": False, "gating": True,
    "num_attention_heads_per_layer": None, "mlp_layer_types": None, "moe_routed_scaling_factor": 1.0,
    "moe_apply_router_weight_on_input": False, "moe_router_logit_softcapping": 0.0,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
    },
}
#: LagunaConfig's default rope thetas per layer type.
THETA = {"full_attention": 500_000.0, "sliding_attention": 10_000.0}
#: gating's values and the output gate scope each gives.
GATING = {True: "head", "per-head": "head", "per-element": "channel", False: "channel"}


def _most_common(counts: list[int]) -> int:
    """The head count of most layers (the earliest on a tie): the block's, the others overrides."""
    return Counter(counts).most_common(1)[0][0]


@dataclass(frozen=True)
class LagunaAttention(Attention):
    """num_attention_heads_per_layer (default: num_attention_heads everywhere) <-> per-layer ``n_heads``; gating <->
    a softplus ``output_gate`` per head (true, "per-head") or per channel ("per-element"), from ``g_proj``."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        mixer = model["block"]["mixer"]
        n_layers = cfg.get_layers("num_hidden_layers")
        heads = cfg.get("num_attention_heads_per_layer") or [mixer["n_heads"]] * n_layers
        if not isinstance(heads, list) or len(heads) != n_layers or \
                any(isinstance(h, bool) or not isinstance(h, int) or h < 1 for h in heads):
            raise UserError(f"{cfg.family}: num_attention_heads_per_layer must give a positive head count for each of "
                            f"the {n_layers} layers, got {heads!r}")
        mixer["n_heads"] = base = _most_common(heads)
        for count in dict.fromkeys(h for h in heads if h != base):
            model.setdefault("layers", []).append(
                {"select": selection([i for i, h in enumerate(heads) if h == count], n_layers),
                 "mixer": {"n_heads": count}})
        gating = cfg.get("gating")
        if not isinstance(gating, (bool, str)) or gating not in GATING:
            raise UserError(f"{cfg.family}: gating must be true or 'per-head' (one softplus gate per head) or "
                            f"'per-element' (one per channel), got {gating!r}")
        scope = GATING[gating]
        if scope == "channel" and cfg.get("attention_bias"):
            raise UserError(f"{cfg.family}: attention_bias with per-element gating is not supported: specformer's "
                            "channel output gate has a bias exactly when q, k and v do, and Laguna's g_proj has none")
        mixer.update(output_gate=True, output_gate_scope=scope, output_gate_activation="softplus")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("mixer", ("attention",))
        for key in ("n_kv_heads", "head_dim", "output_gate", "output_gate_scope", "output_gate_activation", "qkv_bias"):
            view.uniform("mixer", key)
        if not view.uniform("mixer", "output_gate") or view.uniform("mixer", "output_gate_activation") != "softplus":
            raise NotExpressible("model.block.mixer.output_gate", f"Hugging Face {view.name}'s attention always gates "
                                 "its output with softplus (output_gate: true, output_gate_activation: softplus)")
        scope = view.uniform("mixer", "output_gate_scope")
        if scope == "channel" and view.uniform("mixer", "qkv_bias"):
            raise NotExpressible("model.block.mixer.qkv_bias", f"Hugging Face {view.name}'s per-element gate (g_proj) "
                                 "has no bias, which specformer's channel gate has with qkv_bias; gate per head instead")
        heads = view.per_layer("mixer", "n_heads")
        mixer = view.view.layers[0]["mixer"]
        # Unset, n_kv_heads is each layer's n_heads and head_dim d_model / n_heads: one value only where heads agree.
        n_kv = {mixer.get("n_kv_heads") or h for h in heads}
        head_dim = {mixer.get("head_dim") or view.model.d_model // h for h in heads}
        if len(n_kv) > 1 or len(head_dim) > 1:
            raise NotExpressible("model.block.mixer", f"Hugging Face {view.name} has one num_key_value_heads and one "
                                 "head_dim for all layers: set n_kv_heads and head_dim where n_heads differs by layer")
        n_kv, head_dim = n_kv.pop(), head_dim.pop()
        config.update(num_attention_heads=_most_common(heads), num_key_value_heads=n_kv, head_dim=head_dim,
                      num_attention_heads_per_layer=heads, gating=True if scope == "head" else "per-element")

    def rules(self) -> list[Rule]:
        return [*super().rules(), Copy(f"{ATTN}.g_proj.weight", f"{BLOCK_MIXER}.gate.weight")]


@dataclass(frozen=True)
class LagunaExperts(MixtureOfExperts):
    """mlp_layer_types ("dense" or "sparse" per layer; default: the first layer dense) <-> dense SwiGLU layers of
    intermediate_size among the mixtures (Qwen-MoE's mlp_only_layers, as the experts part reads them)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n_layers - 1)
        if not isinstance(types, list) or len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
            raise UserError(f"{cfg.family}: mlp_layer_types must give 'dense' or 'sparse' for each of the {n_layers} "
                            f"layers, got {types!r}")
        cfg.data.update(decoder_sparse_step=1, mlp_only_layers=[i for i, t in enumerate(types) if t == "dense"])
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        del config["decoder_sparse_step"]
        dense = config.pop("mlp_only_layers")
        config["mlp_layer_types"] = ["dense" if i in dense else "sparse" for i in range(view.model.n_layers)]


@dataclass(frozen=True)
class LagunaRopes(LayerTypeRopes):
    """LayerTypeRopes reading a config.json without rope fields as LagunaConfig does (its per-layer-type defaults,
    half of each head rotated on the full layers), and whose export leaves sliding_window out where no layer slides:
    LagunaConfig takes only an integer there (its default, 512, then sizes nothing)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if all(cfg.data.get(key) is None for key in ("rope_parameters", "rope_scaling", "rope_theta")):
            cfg.data["rope_parameters"] = copy.deepcopy(DEFAULTS["rope_parameters"])
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        if config["sliding_window"] is None:
            del config["sliding_window"]


FAMILY = decoder_family(
    name="Laguna",
    model_type="laguna",
    architecture="LagunaForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(replace_part(LLAMA_PARTS, LagunaAttention(), instead_of=Attention),
                                   LagunaExperts(hidden="moe_intermediate_size", shared=True, shared_gate=False,
                                                 shared_names=("shared_expert", "shared_experts"), dense=True,
                                                 selection_bias=(f"{MLP}.experts.e_score_correction_bias",
                                                                 f"{MLP}.gate.e_score_correction_bias"),
                                                 scaling="moe_routed_scaling_factor",
                                                 softcap="moe_router_logit_softcapping"),
                                   instead_of=GatedFFN),
                      LagunaRopes(pattern=1, theta=THETA, pattern_key=None, flat_is_full=False, partial=True),
                      instead_of=Rope),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("head"),
        Refuse("moe_apply_router_weight_on_input", (False,),
               why="transformers' Laguna raises NotImplementedError for router weights on the MoE input"),
    ],
    maps="GQA with head_dim and num_attention_heads_per_layer -> per-layer n_heads, per-head q/k RMSNorm, "
         "attention_bias on q/k/v/o, gating -> a softplus output_gate (g_proj) per head (true, per-head) or per "
         "channel (per-element); layer_types (default all full) and sliding_window -> per-layer windows; "
         "rope_parameters per layer type (partial_rotary_factor) -> per-layer ropes; ffn moe: num_experts, "
         "num_experts_per_tok, moe_intermediate_size, router sigmoid_topk (always renormalised; "
         "e_score_correction_bias -> selection_bias, moe_router_logit_softcapping -> logit_softcap, "
         "moe_routed_scaling_factor -> scaling_factor), one ungated shared expert of shared_expert_intermediate_size; "
         "mlp_layer_types (default: the first layer dense) -> dense SwiGLU layers (intermediate_size)",
    caveats="moe_apply_router_weight_on_input must be false (transformers raises on true); attention_bias needs per-head "
            "gating; reads per-expert and fused 3-D expert tensors, writes per-expert",
)
