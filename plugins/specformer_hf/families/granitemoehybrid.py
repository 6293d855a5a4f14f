"""Granite 4.0-H (``model_type: granitemoehybrid``, granite-4.0-h-tiny, -small, -micro): Mamba-2 and attention layers,
each followed by a mixture of experts plus an always-on shared expert, with muP-style multipliers.

Every layer is either a Mamba-2 mixer (``layer_types`` ``mamba`` / ``linear_attention``) or
grouped-query attention (``attention`` / ``full_attention``), never both; the base block holds
the more common one and ``layers:`` overrides the others. The feed-forward is a mixture of
``num_local_experts`` SwiGLU experts, top-``num_experts_per_tok`` of the router's logits
softmaxed (the same weights as a softmax over all experts renormalised over the kept ones:
``normalize_topk``), plus one shared SwiGLU expert of ``shared_intermediate_size``; with no
experts the shared expert alone is the layer's feed-forward.

Granite's four multipliers each have a place of their own (see :mod:`specformer_hf.parts.multipliers`);
the experts' fused layout is :class:`~specformer_hf.parts.feedforward.GraniteExperts`'.
``position_embedding_type`` null or ``nope`` is no positions at all (``positional: none``; the
published Granite 4.0-H models say ``nope``), ``rope`` the usual rope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import Attention, attention_sizes
from specformer_hf.parts.base import (BLOCK_MIXER, LAYER, FamilyView, Part, keeps_keys, keeps_state,
                                      layers_of_two_kinds, uniform_mixers)
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GraniteExperts
from specformer_hf.parts.mamba2 import HYBRID_FIELDS, mamba2_rules
from specformer_hf.parts.multipliers import Multipliers, ScaledResiduals, attention_multiplier_config
from specformer_hf.parts.norms import RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import AtLayers, Rule
from specformer_hf.specview import NotExpressible

#: transformers' GraniteMoeHybridConfig defaults.
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0,
    "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001, "shared_intermediate_size": 1024,
    "position_embedding_type": None, "layer_types": None, "mamba_n_heads": 128, "mamba_n_groups": 1,
    "mamba_d_state": 256, "mamba_d_head": "auto", "mamba_d_conv": 4, "mamba_expand": 2, "mamba_chunk_size": 256,
    "mamba_conv_bias": True, "mamba_proj_bias": False, "time_step_limit": (0.0, float("inf")),
}

#: layer_types names (transformers 5's and the published configs' older ones) -> the layer's mixer.
LAYER_TYPES = {"linear_attention": "mamba2", "mamba": "mamba2", "full_attention": "attention", "attention": "attention"}
MAMBA_FIELDS = ("mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_head", "mamba_d_conv", "mamba_expand",
                "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias", "time_step_limit")


def layer_mixers(cfg: ConfigReader, default: str) -> list[str]:
    """Each layer's mixer kind (``mamba2`` or ``attention``) from layer_types (``default`` everywhere without it)."""
    n_layers = cfg.get_layers("num_hidden_layers")
    types = cfg.get("layer_types", None) or [default] * n_layers
    if not isinstance(types, list) or len(types) != n_layers:
        raise UserError(f"{cfg.family}: layer_types must name the type of each of the {n_layers} layers, got {types!r}")
    unknown = sorted({str(t) for t in types if t not in LAYER_TYPES})
    if unknown:
        raise UserError(f"{cfg.family}: layer_types {unknown} are not supported; supported: {', '.join(LAYER_TYPES)}")
    return [LAYER_TYPES[t] for t in types]


def hybrid_layers(model: dict[str, Any], kinds: list[str], mixers: dict[str, dict[str, Any]]) -> None:
    """The more common mixer in the block (Mamba-2 on a tie), the other in ``layers:`` overrides."""
    layers_of_two_kinds(model, kinds, {kind: {"mixer": mixers[kind]} for kind in ("mamba2", "attention")
                                       if kind in mixers})


def mamba_config(view: FamilyView, layers: list[dict[str, Any]], *, gates_first: bool = False) -> dict[str, Any]:
    """The config fields of the Mamba-2 layers among ``layers`` (none without any), as the Granite 4.0-H and Bamba
    configs hold them: one set for every Mamba layer, the inner width as ``mamba_expand`` x d_model, the norm's eps the
    block norms'. ``gates_first``: the family gates before its Mamba norm (Bamba), so ``norm_before_gate`` is refused."""
    mamba = [layer["mixer"] for layer in layers if layer["mixer"]["kind"] == "mamba2"]
    if not mamba:
        return {}
    m = uniform_mixers(mamba, family=view.name, what="Mamba-2")
    d_inner = m["n_heads"] * m["head_dim"]
    if d_inner % view.model.d_model:
        raise NotExpressible("model.block.mixer", f"Hugging Face {view.name}'s Mamba inner width is "
                             f"mamba_expand x d_model; n_heads x head_dim = {d_inner} is no multiple of "
                             f"{view.model.d_model}")
    if m["norm_eps"] != view.uniform("norm", "eps"):
        raise NotExpressible("model.block.mixer.norm_eps", f"Hugging Face {view.name}'s Mamba norm uses "
                             f"rms_norm_eps, the block norms' eps ({view.uniform('norm', 'eps')})")
    if gates_first and m["norm_before_gate"]:
        raise NotExpressible("model.block.mixer.norm_before_gate", f"Hugging Face {view.name} gates before its "
                             "Mamba norm (norm_before_gate: false)")
    return {**HYBRID_FIELDS.config(m, d_model=view.model.d_model, family=view.name),
            "mamba_expand": d_inner // view.model.d_model}


@dataclass(frozen=True)
class GranitePositions(Part):
    """position_embedding_type: null or nope (no positions; the published configs say nope) or rope."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        kind = cfg.require("position_embedding_type", (None, "nope", "rope"),
                           why="Granite 4.0-H uses no positions (null, nope) or rope")
        if kind == "rope":
            Rope().read(cfg, model)
        else:
            cfg.mark_read("rope_parameters", "rope_theta", "rope_scaling")  # unused without rope, as in transformers
            model["positional"] = {"kind": "none"}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if view.positional["kind"] == "none":
            view.view.one_positional(family=view.name)
            config["position_embedding_type"] = "nope"  # as the published configs write it
        else:
            Rope().write(view, config)
            config["position_embedding_type"] = "rope"


@dataclass(frozen=True)
class GraniteMixers(Part):
    """layer_types, the attention's sizes, attention_bias and attention_multiplier, the mamba_* fields."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        kinds = layer_mixers(cfg, "mamba")
        mixers: dict[str, dict[str, Any]] = {}
        bias = bool(cfg.get("attention_bias"))
        attention = attention_sizes(cfg)
        attention.update(qkv_bias=bias, out_bias=bias, scale=cfg.get_float("attention_multiplier"))
        mixers["attention"] = attention
        if "mamba2" in kinds:
            d_inner = cfg.get_size("mamba_expand") * cfg.get_size("hidden_size")
            mixers["mamba2"] = HYBRID_FIELDS.spec(cfg, d_inner=d_inner)
        else:
            cfg.mark_read(*MAMBA_FIELDS)  # no Mamba layer: the fields are inert
        hybrid_layers(model, kinds, mixers)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = view.per_layer("mixer", "kind")
        for i, kind in enumerate(kinds):
            if kind not in ("attention", "mamba2"):
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{kind!r} has no equivalent in Hugging Face "
                                     f"{view.name} (whose layers are 'mamba2' or 'attention')")
        config["layer_types"] = ["full_attention" if kind == "attention" else "linear_attention" for kind in kinds]
        layers = view.view.layers
        attention = [layer["mixer"] for layer in layers if layer["mixer"]["kind"] == "attention"]
        if attention:
            a = uniform_mixers(attention, family=view.name, what="attention")
            index = kinds.index("attention")
            n_heads, n_kv, head_dim = view.view.attention_sizes(index)
            if n_heads * head_dim != view.model.d_model:
                raise NotExpressible("model.block.mixer.head_dim", f"Hugging Face {view.name} has head_dim = "
                                     f"d_model / n_heads ({view.model.d_model} / {n_heads})")
            config.update(num_attention_heads=n_heads, num_key_value_heads=n_kv, attention_bias=a["qkv_bias"],
                          attention_multiplier=attention_multiplier_config(a.get("scale"), head_dim))
        config.update(mamba_config(view, layers))

    def rules(self) -> list[Rule]:
        attention = [AtLayers(rule, where=lambda site: keeps_keys(site.mixer), layers="attention")
                     for rule in Attention().rules()]
        mamba = [AtLayers(rule, where=lambda site: keeps_state(site.mixer), layers="Mamba-2")
                 for rule in mamba2_rules(f"{LAYER}.mamba", BLOCK_MIXER)]
        return attention + mamba


FAMILY = decoder_family(
    name="Granite 4.0-H",
    model_type="granitemoehybrid",
    architecture="GraniteMoeHybridForCausalLM",
    defaults=DEFAULTS,
    parts=[Sizes(), GranitePositions(), ScaledResiduals(), RMSNorm(), GraniteMixers(), GraniteExperts(), Multipliers()],
    maps="layer_types -> mamba2 or attention per layer (layers: overrides); mamba_* and time_step_limit -> mamba2; "
         "attention_multiplier -> mixer.scale; num_local_experts (top-k softmax) + shared_intermediate_size -> moe "
         "with one shared expert (no experts: swiglu); residual_multiplier -> layout.residual_multiplier; "
         "embedding_multiplier; logits_scaling -> logit_scale = 1 / logits_scaling; position_embedding_type null/rope",
    caveats="one attention and one Mamba-2 setting for all layers; head_dim is d_model / n_heads; reads fused or "
            "checkpoint-named expert tensors, writes them as save_pretrained does",
)
