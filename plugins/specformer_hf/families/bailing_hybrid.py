"""Ling 3 (``model_type: bailing_hybrid``): Kimi Linear's hybrid layout with Ling's own parts.

Most layers are Kimi Delta Attention with a bounded forget gate and full-width decay and
output-gate projections (``kda`` with ``decay_bound``, ``decay_rank: full``, ``gate_rank:
full``); every ``layer_group_size``-th layer is DeepSeek-V3's latent attention with
interleaved rope and a sigmoid gate per head (``mla`` with ``output_gate``). The experts are
DeepSeek-V3's (sigmoid-scored, grouped, a selection bias, shared experts), with dense first
layers. transformers saves the tensors under the original names (``model.word_embeddings``,
``attention.*``, ``attention.dense``, the q/k/v convolutions apart, the forget gate's tensors
directly in ``attention``, ``mlp.gate.expert_bias``) and renames them on load; import reads
and export writes those.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families.kimi_linear import KimiExperts, _kda_qkv_sizes, _one_setting
from specformer_hf.parts.attention import LATENT_EPS, LatentAttention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, MLP, FamilyView, Part, SavedNames, layers_of_two_kinds
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import expert_rules, shared_halves
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import rope, rope_parameters_of
from specformer_hf.rules import Copy, DepthwiseConv, Fused, Rule, halves, renamed
from specformer_hf.specview import NotExpressible

#: transformers' BailingHybridConfig defaults (inclusionAI/Ling-3.0-Flash's shapes), under the names the parts read.
DEFAULTS = {
    "vocab_size": 157184, "hidden_size": 2560, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_hidden_layers": 42, "num_attention_heads": 32, "num_key_value_heads": 32, "num_local_experts": 512,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
    "norm_topk_prob": True, "first_k_dense_replace": 2, "hidden_act": "silu", "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "kv_lora_rank": 512,
    "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "head_dim": 128,
    "short_conv_kernel_size": 4, "layer_group_size": 6, "kda_safe_gate": True, "kda_lower_bound": -5.0,
    "layer_types": None, "mlp_layer_types": None, "expert_swiglu_limit_list": None,
    "share_expert_swiglu_limit_list": None, "num_mtp_layers": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 6000000.0},
}

#: (the name config.json holds, as transformers saves it and inclusionAI publishes it; the name the parts read).
SAVED_NAMES = (
    ("model_max_length", "max_position_embeddings"), ("num_experts", "num_local_experts"),
    ("num_experts_per_token", "num_experts_per_tok"), ("num_shared_experts", "n_shared_experts"),
    ("num_expert_group", "n_group"), ("moe_renormalize", "norm_topk_prob"),
    ("num_nextn_predict_layers", "num_mtp_layers"),
)
MIXERS = ("kda", "mla")
LAYER_TYPES = {"kda": "linear_attention", "mla": "full_attention"}


@dataclass(frozen=True)
class InterleavedRope(Part):
    """rope_parameters <-> the rope of the latent attention's rotary channels, always interleaved (transformers'
    Ling 3 pairs channels as DeepSeek-V3 does, with no rope_interleave switch)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model["positional"] = {**rope(cfg), "interleaved": True}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.view.one_positional(family=view.name)
        pos = dict(view.positional)
        if pos.get("kind") != "rope" or not pos.pop("interleaved", False):
            raise NotExpressible("model.positional", f"Hugging Face {view.name} rotates interleaved pairs "
                                 "(rope with interleaved: true)")
        config["rope_parameters"] = rope_parameters_of({**pos, "interleaved": False}, view.name, path="model.positional",
                                                       context_length=view.model.context_length)


@dataclass(frozen=True)
class UntiedHead(Part):
    """transformers' Ling 3 never ties its LM head to the embeddings (no tied weights), whatever
    tie_word_embeddings says: the head is always its own tensor."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.mark_read("tie_word_embeddings")
        model["tie_embeddings"] = False

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if view.model.tie_embeddings:
            raise NotExpressible("model.tie_embeddings", f"Hugging Face {view.name} never ties its LM head to the "
                                 "embeddings")
        config["tie_word_embeddings"] = False


def _kda(cfg: ConfigReader) -> dict[str, Any]:
    """The linear-attention layers: sizes from the linear_* fields transformers saves, else the published ones
    (head_dim, num_attention_heads, short_conv_kernel_size); the forget gate bounded when kda_safe_gate."""
    head_dim = cfg.get_size("linear_head_dim") if "linear_head_dim" in cfg.data else cfg.get_size("head_dim")
    heads = (cfg.get_size("linear_num_heads") if "linear_num_heads" in cfg.data
             else cfg.get_size("num_attention_heads"))
    kernel = (cfg.get_size("linear_conv_kernel_dim") if "linear_conv_kernel_dim" in cfg.data
              else cfg.get_size("short_conv_kernel_size"))
    cfg.mark_read("short_conv_kernel_size", "head_dim")
    if kernel < 2:
        raise UserError(f"{cfg.family}: short_conv_kernel_size {kernel} is not supported: the short convolution needs "
                        "a kernel of 2 or more")
    mixer = {"kind": "kda", "n_heads": heads, "head_dim": head_dim, "conv_kernel": kernel, "decay_rank": "full",
             "gate_rank": "full", "norm_eps": cfg.get_float("rms_norm_eps")}
    bound = cfg.get_float("kda_lower_bound")
    if cfg.get("kda_safe_gate"):
        if not bound < 0:
            raise UserError(f"{cfg.family}: kda_lower_bound must be negative (the least log decay per token), "
                            f"got {bound!r}")
        mixer["decay_bound"] = bound
    return mixer


def _layer_types(cfg: ConfigReader, n_layers: int) -> list[str]:
    """layer_types, else full attention in the last layer of every layer_group_size."""
    types = cfg.get("layer_types")
    group = cfg.get_size("layer_group_size")
    if types is None:
        types = ["full_attention" if (i + 1) % group == 0 else "linear_attention" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers or any(t not in LAYER_TYPES.values() for t in types):
        raise UserError(f"{cfg.family}: the layer types must be linear_attention or full_attention for each of the "
                        f"{n_layers} layers, got {types!r}")
    return list(types)


@dataclass(frozen=True)
class HybridMixers(Part):
    """layer_types (or layer_group_size), the linear_* sizes, kda_safe_gate and kda_lower_bound <-> ``kda`` layers
    (bounded forget gate, full-width decay and output gate) and ``mla`` layers (DeepSeek-V3's with a gate per head),
    the more common one in the block, the others as ``layers:`` overrides."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        kinds = ["kda" if t == "linear_attention" else "mla" for t in _layer_types(cfg, n_layers)]
        latent: dict[str, Any] = {"positional": model["positional"]}
        LatentAttention().read(cfg, latent)
        mixers = {"kda": _kda(cfg), "mla": {**latent["block"]["mixer"], "output_gate": True}}
        if "kda" in kinds:
            cfg.require("hidden_act", ("silu",), why="the linear attention's short convolution uses hidden_act, "
                                                     "and KDA's is SiLU")
        layers_of_two_kinds(model, kinds, {kind: {"mixer": mixers[kind]} for kind in MIXERS})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        layers = view.per_layer("mixer")
        for i, mixer in enumerate(layers):
            if mixer["kind"] not in MIXERS:
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{mixer['kind']!r} has no equivalent in "
                                     f"Hugging Face {view.name} (which uses 'kda' or 'mla')")
        kinds = [m["kind"] for m in layers]
        config["layer_types"] = [LAYER_TYPES[k] for k in kinds]
        config["layer_group_size"] = len(kinds) + 1  # layer_types decides; this only has to be a positive size
        kda = _one_setting(view, [m for m in layers if m["kind"] == "kda"], "kda")
        mla = _one_setting(view, [m for m in layers if m["kind"] == "mla"], "mla")
        if kda is not None:
            head_dim = kda["head_dim"] or view.model.d_model // kda["n_heads"]
            if (kda["value_head_dim"] or head_dim) != head_dim or kda["decay_rank"] != "full" \
                    or kda["gate_rank"] != "full" or kda["conv_bias"]:
                raise NotExpressible("model.layers[*].mixer", f"Hugging Face {view.name}'s linear attention has values "
                                     "of head_dim, decay_rank and gate_rank full and no conv_bias")
            if kda["norm_eps"] != view.uniform("norm", "eps"):
                raise NotExpressible("model.layers[*].mixer.norm_eps", f"Hugging Face {view.name}'s linear attention "
                                     "output norm shares rms_norm_eps with the block norms")
            config.update(linear_num_heads=kda["n_heads"], linear_head_dim=head_dim, head_dim=head_dim,
                          linear_conv_kernel_dim=kda["conv_kernel"], short_conv_kernel_size=kda["conv_kernel"],
                          kda_safe_gate=kda["decay_bound"] is not None)
            if kda["decay_bound"] is not None:
                config["kda_lower_bound"] = kda["decay_bound"]
        if mla is not None:
            if mla["latent_norm"].get("kind") != "rmsnorm" or mla["latent_norm"].get("eps") != LATENT_EPS \
                    or mla["window"] is not None or not mla["output_gate"] or mla.get("indexer") is not None:
                raise NotExpressible("model.layers[*].mixer", f"Hugging Face {view.name}'s latent attention has "
                                     f"RMSNorm latents (eps {LATENT_EPS}), no window or indexer, and output_gate")
            if mla["scale"] is not None or mla["yarn_factor"] is not None:
                raise NotExpressible("model.layers[*].mixer.scale", f"Hugging Face {view.name}'s latent attention "
                                     "scales scores by 1/sqrt(qk_nope_head_dim + qk_rope_head_dim)")
            config.update(num_attention_heads=mla["n_heads"], num_key_value_heads=mla["n_heads"],
                          kv_lora_rank=mla["kv_lora_rank"], qk_rope_head_dim=mla["qk_rope_head_dim"],
                          qk_nope_head_dim=mla["qk_nope_head_dim"], v_head_dim=mla["v_head_dim"],
                          q_lora_rank=mla["q_lora_rank"], attention_bias=mla["bias"])
        elif kda is not None:
            config["num_attention_heads"] = kda["n_heads"]

    def rules(self) -> list[Rule]:
        # The latent attention's, then the linear attention's beside them (o_proj serves both as the output).
        gate = Copy(f"{ATTN}.g_proj.weight", f"{BLOCK_MIXER}.gate.weight")
        return LatentAttention().rules() + [gate] + _kda_rules()


def _kda_rules() -> list[Rule]:
    """BailingHybridDeltaAttention's tensors, as transformers holds them (renamed to the saved names below)."""
    forget = f"{ATTN}.forget_gate"
    return [
        Fused([f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"], f"{BLOCK_MIXER}.qkv.weight",
              sizes=_kda_qkv_sizes),
        DepthwiseConv([f"{ATTN}.{x}_conv1d.weight" for x in "qkv"], f"{BLOCK_MIXER}.conv_weight", sizes=_kda_qkv_sizes),
        Copy(f"{forget}.f_proj.weight", f"{BLOCK_MIXER}.f.weight"),
        Copy(f"{forget}.A_log", f"{BLOCK_MIXER}.A_log"),
        Copy(f"{forget}.dt_bias", f"{BLOCK_MIXER}.dt_bias"),
        *(Copy(f"{ATTN}.{name}.weight", f"{BLOCK_MIXER}.{ours}.weight")
          for name, ours in (("b_proj", "b"), ("g_proj", "g"), ("o_norm", "norm"))),
    ]


@dataclass(frozen=True)
class Experts(KimiExperts):
    """As Kimi Linear's (DeepSeek-V3's experts, shared experts, dense first layers); the per-layer SwiGLU clipping
    limits (expert_swiglu_limit_list, share_expert_swiglu_limit_list) must be 0, that is off."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        if cfg.get("mlp_layer_types") is None:
            dense_first = cfg.get_int("first_k_dense_replace")
            cfg.data["mlp_layer_types"] = ["dense" if i < dense_first else "sparse" for i in range(n_layers)]
        cfg.mark_read("first_k_dense_replace", "num_mtp_layers")  # the skipped multi-token-prediction layers
        for key in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
            limits = cfg.get(key)
            if limits is not None and any(limits):
                raise UserError(f"{cfg.family}: {key} {limits!r} is not supported: specformer has no SwiGLU clipped "
                                "after the activation (min(silu(gate), limit) * clamp(up, -limit, limit)); "
                                "only limits of 0 (off)")
        super().read(cfg, model)

    def rules(self) -> list[Rule]:
        """Experts per expert (as saved) or fused, the router and its selection bias, shared experts, dense layers."""
        return [
            *expert_rules(saved=MLP),
            Copy(f"{MLP}.gate.e_score_correction_bias", "blocks.{i}.ffn.router.selection_bias"),
            Fused([f"{MLP}.shared_experts.gate_proj.weight", f"{MLP}.shared_experts.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{MLP}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
            Fused([f"{MLP}.gate_proj.weight", f"{MLP}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
            Copy(f"{MLP}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
        ]

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        for i, ffn in enumerate(view.per_layer("ffn")):
            if ffn.get("swiglu_limit") is not None:
                raise NotExpressible(f"model.layers[{i}].ffn.swiglu_limit", f"Hugging Face {view.name} clips the "
                                     "SwiGLU after the activation, not as specformer's swiglu_limit")
        super().write(view, config)


@dataclass(frozen=True)
class WrittenNames(Part):
    """Export writes the fields under the names transformers saves them (its attribute_map)."""

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        for saved, name in SAVED_NAMES:
            if name in config:
                config[saved] = config.pop(name)


PARTS = (SavedNames(SAVED_NAMES), Sizes(), UntiedHead(), InterleavedRope(), Layout("prenorm"), RMSNorm(), HybridMixers(), Experts(),
         WrittenNames())

#: transformers' in-memory name -> the saved one (regular expressions, in order), as its conversion mapping reverses.
RENAMES = (
    (r"^model\.embed_tokens\.", "model.word_embeddings."),
    (r"\.self_attn\.forget_gate\.", ".self_attn."),
    (r"\.self_attn\.o_proj\.", ".attention.dense."),
    (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.gate.expert_bias"),
    (r"\.self_attn\.", ".attention."),
)


def saved_name(name: str) -> str:
    for pattern, replacement in RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


_DRAFT = decoder_family(name="Ling 3", model_type="bailing_hybrid", architecture="BailingHybridForCausalLM",
                        defaults=DEFAULTS, parts=PARTS)

FAMILY = decoder_family(
    name="Ling 3",
    model_type="bailing_hybrid",
    architecture="BailingHybridForCausalLM",
    defaults=DEFAULTS,
    parts=PARTS,
    rules=[renamed(rule, saved_name) for rule in _DRAFT.weights],
    # Ling-3.0-Flash (42 layers) stores its multi-token-prediction layer as layer 42; transformers' BailingHybridModel
    # ignores the layers past num_hidden_layers (_keys_to_ignore_on_load_unexpected), and so does import.
    ignore_tensors=(r"model\.layers\.42\..*",),
    non_math_fields=("mtp_loss_scaling_factor",),
    maps="attention kda with a bounded forget gate (decay_bound: kda_lower_bound when kda_safe_gate) and full-width "
         "decay and output-gate projections (linear_head_dim / head_dim, linear_num_heads, short_conv_kernel_size; "
         "gated output norm with rms_norm_eps) and mla with a sigmoid gate per head (output_gate) and interleaved "
         "rope, per layer: layer_types (or every layer_group_size-th layer mla) -> layers: overrides; ffn moe with "
         "router sigmoid_topk (moe_renormalize, routed_scaling_factor, num_expert_group, topk_group; expert_bias -> "
         "selection_bias), num_shared_experts; mlp_layer_types (or first_k_dense_replace) -> dense layers",
    caveats="the LM head is never tied (transformers' Ling 3 ignores tie_word_embeddings); the "
            "multi-token-prediction layer of Ling-3.0-Flash (model.layers.42) is skipped, as transformers skips it; "
            "expert_swiglu_limit_list and share_expert_swiglu_limit_list must be 0 (SwiGLU clipped after the "
            "activation is not supported); the short convolution uses hidden_act, which must be silu; at least one "
            "shared expert; aux_loss_coef is 0 on import",
)
