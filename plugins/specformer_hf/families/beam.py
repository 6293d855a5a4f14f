"""Beam (``model_type: beam``, Reflection AI): sandwich-normed blocks whose adds are depth-scaled, attention with
per-head query/key norms and a per-channel output gate biased per head, sliding-window layers with the rope beside
global layers without positions whose queries grow with position, and DeepSeek-V3's grouped sigmoid experts (no
shared experts) on the layers ``mlp_layer_types`` makes sparse.

Each residual add is ``x sqrt((k-1)/k) + f / sqrt(k)`` with ``k = 2l + 2`` after the attention
and ``2l + 3`` after the MLP of layer ``l`` (the sandwich's ``depth_scaled_residual``). The global
layers multiply their queries by ``(1 + (p + 1) / 2048) ^ 0.1`` (``query_length_scale``, its base
and exponent fixed in transformers). ``gate_proj`` has no bias; ``gate_bias`` holds one per head
(``output_gate_bias: head``). ``rope_parameters`` is keyed by layer type, ``full_attention: null``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import Attention, QKNorm
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, MLP, FamilyView, Part, Switch, Value, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN, GroupedExperts, expert_rules, the_moe_setting
from specformer_hf.parts.norms import RMSNorm
from specformer_hf.parts.positions import rope, rope_parameters_of
from specformer_hf.parts.windows import layer_types_from_config, windowed
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible

#: transformers' BeamConfig defaults (Beam-1.0-501B-A23B; Qwen3-MoE's for what Beam does not set).
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 5120, "intermediate_size": 20480, "num_hidden_layers": 52,
    "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "attention_bias": False, "sliding_window": 512, "moe_intermediate_size": 2560, "num_experts_per_tok": 8,
    "num_experts": 256, "norm_topk_prob": True, "layer_types": None, "mlp_layer_types": None, "n_group": 8,
    "topk_group": 4, "routed_scaling_factor": 2.5, "final_logit_softcapping": 30.0,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}, "full_attention": None},
}
#: transformers' rope theta where a layer type's rope_parameters has none (PreTrainedConfig.default_theta).
DEFAULT_THETA = 10_000.0
#: Beam's query scale on its global layers, fixed in transformers' compute_attention_scaling.
LENGTH_SCALE = {"query_length_scale": True, "query_length_scale_base": 2048.0, "query_length_scale_exponent": 0.1}


def default_layer_types(n_layers: int) -> list[str]:
    """Every sixth layer global, and the last one."""
    types = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n_layers)]
    types[-1] = "full_attention"
    return types


@dataclass(frozen=True)
class DepthScaledSandwich(Part):
    """Sandwich RMSNorms (Gemma 2's names) whose adds are depth-scaled (``depth_scaled_residual``)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["layout"] = {"kind": "sandwich", "depth_scaled_residual": True}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("layout", ("sandwich",))
        if not view.uniform("layout", "depth_scaled_residual"):
            raise NotExpressible("model.block.layout.depth_scaled_residual", f"Hugging Face {view.name} scales every "
                                 "residual add by its depth (depth_scaled_residual: true)")

    def rules(self) -> list[Rule]:
        names = (("attention_norm", "input_layernorm"), ("attention_post_norm", "post_attention_layernorm"),
                 ("ffn_norm", "pre_feedforward_layernorm"), ("ffn_post_norm", "post_feedforward_layernorm"))
        return [Copy(f"model.layers.{{i}}.{hf}.weight", f"blocks.{{i}}.{ours}.weight") for ours, hf in names]


@dataclass(frozen=True)
class SlidingRopeGlobalScaledNope(Part):
    """layer_types (default: every sixth layer and the last global), sliding_window and rope_parameters keyed by
    layer type <-> per-layer windows, the rope on the sliding layers, and on the global ones no positions and the
    query length scale."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = layer_types_from_config(cfg, default_layer_types(n_layers))
        stored = cfg.get("rope_parameters") or DEFAULTS["rope_parameters"]  # null: transformers' default
        if not isinstance(stored, dict) or set(stored) - {"sliding_attention", "full_attention"}:
            raise UserError(f"{cfg.family}: rope_parameters must be keyed by layer type "
                            f"({{sliding_attention: {{...}}, full_attention: null}}), got {stored!r}")
        if stored.get("full_attention") is not None:
            raise UserError(f"{cfg.family}: rope_parameters.full_attention must be null (Beam's global layers run "
                            f"without positions, scaling their queries), got {stored['full_attention']!r}")
        params = dict(stored.get("sliding_attention") or {"rope_type": "default"})
        params.setdefault("rope_theta", DEFAULT_THETA)
        single = ConfigReader({"rope_parameters": params, "max_position_embeddings": cfg.get("max_position_embeddings")},
                              defaults={}, family=f"{cfg.family} (sliding_attention layers)")
        model["positional"] = rope(single)
        cfg.unused.extend(single.unused)
        windowed(model, [cfg.get("sliding_window") if t == "sliding_attention" else None for t in types])
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if full:
            model.setdefault("layers", []).append({"select": selection(full, n_layers), "positional": "none",
                                                   "mixer": dict(LENGTH_SCALE)})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("mixer", "window")
        sliding = {w for w in windows if w is not None}
        if len(sliding) != 1:
            raise NotExpressible("model.layers[*].mixer.window", f"Hugging Face {view.name} has one sliding_window on "
                                 f"its local layers, and at least one (got {sorted(sliding) or 'none'})")
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        mixers = view.per_layer("mixer")
        for i, (window, scheme, mixer) in enumerate(zip(windows, schemes, mixers)):
            local = window is not None
            if scheme["kind"] != ("rope" if local else "none") or (local and scheme != view.positional):
                raise NotExpressible(f"model.layers[{i}].positional", f"Hugging Face {view.name}'s "
                                     + ("sliding layers use the rope (model.positional)" if local else
                                        "global layers use positional none"))
            scale = {k: mixer.get(k) for k in LENGTH_SCALE}
            if (local and scale["query_length_scale"]) or (not local and scale != LENGTH_SCALE):
                raise NotExpressible(f"model.layers[{i}].mixer.query_length_scale", f"Hugging Face {view.name} scales "
                                     "the queries of its global layers, and only those, by (1 + (p + 1) / 2048) ^ 0.1")
        params = rope_parameters_of({**view.positional, "interleaved": False}, view.name, path="model.positional",
                                    context_length=view.model.context_length)
        if view.positional.get("interleaved"):
            raise NotExpressible("model.positional.interleaved", f"Hugging Face {view.name} rotates halves")
        config.update(rope_parameters={"sliding_attention": params, "full_attention": None},
                      sliding_window=sliding.pop(),
                      layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])


@dataclass(frozen=True)
class HeadBiasedGateAttention(Attention):
    """Attention gated channel by channel by sigmoid(gate_proj x + gate_bias[head]) before o_proj
    (``output_gate``, ``output_gate_bias: head``)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        model["block"]["mixer"].update(output_gate=True, output_gate_bias="head")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if (not view.uniform("mixer", "output_gate") or view.uniform("mixer", "output_gate_scope") != "channel"
                or view.uniform("mixer", "output_gate_bias") != "head"):
            raise NotExpressible("model.block.mixer.output_gate", f"Hugging Face {view.name}'s attention always gates "
                                 "each output channel with one bias per head (output_gate: true, output_gate_scope: "
                                 "channel, output_gate_bias: head)")
        super().write(view, config)

    def rules(self) -> list[Rule]:
        return [*super().rules(), Copy(f"{ATTN}.gate_proj.weight", f"{BLOCK_MIXER}.gate.weight"),
                Copy(f"{ATTN}.gate_bias", f"{BLOCK_MIXER}.gate_head_bias")]


@dataclass(frozen=True)
class BeamExperts(GroupedExperts):
    """DeepSeek-V3's grouped sigmoid experts under Beam's names (num_experts), no shared experts, on the layers
    ``mlp_layer_types`` calls sparse (default: all but the first three); the dense ones a SwiGLU of intermediate_size."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = cfg.get("mlp_layer_types") or ["dense"] * min(3, n_layers) + ["sparse"] * max(0, n_layers - 3)
        if len(types) != n_layers or set(types) - {"dense", "sparse"}:
            raise UserError(f"{cfg.family}: mlp_layer_types must name 'dense' or 'sparse' for each of the "
                            f"{n_layers} layers, got {types!r}")
        cfg.data.update(n_routed_experts=cfg.get("num_experts"), n_shared_experts=0, first_k_dense_replace=0)
        super().read(cfg, model)
        dense = [i for i, t in enumerate(types) if t == "dense"]
        if dense:
            activation = model["block"]["ffn"]["activation"]
            model.setdefault("layers", []).append({"select": selection(dense, n_layers), "ffn": {
                "kind": "swiglu" if activation == "silu" else "geglu", "hidden": cfg.get_int("intermediate_size"),
                "activation": activation}})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        ffns = view.per_layer("ffn")
        ffn, dense = the_moe_setting(view)
        router = ffn.get("router") or {}
        if router.get("kind") != "sigmoid_topk" or router.get("bias") or not router.get("selection_bias", True):
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name} routes with sigmoid_topk (no score "
                                 "bias, a selection bias)")
        if ffn.get("n_shared_experts"):
            raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has no shared experts")
        if any(f["kind"] != "swiglu" for f in dense) or len({f["hidden"] for f in dense}) > 1:
            raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name}'s dense layers are one SwiGLU of "
                                 "intermediate_size")
        if ffn["activation"] != "silu":
            raise NotExpressible("model.block.ffn.activation", f"Hugging Face {view.name}'s MLPs are SwiGLU (silu)")
        config.update(num_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], moe_intermediate_size=ffn["hidden"],
                      norm_topk_prob=router["normalize"], routed_scaling_factor=router["scaling_factor"],
                      n_group=router["n_group"], topk_group=router["topk_group"], hidden_act="silu",
                      mlp_layer_types=["sparse" if f["kind"] == "moe" else "dense" for f in ffns])
        if dense:
            config["intermediate_size"] = dense[0]["hidden"]

    def rules(self) -> list[Rule]:
        return [*expert_rules(saved=MLP), Copy(f"{MLP}.gate.e_score_correction_bias", "blocks.{i}.ffn.router.selection_bias"),
                *GatedFFN().rules()]


FAMILY = decoder_family(
    name="Beam",
    model_type="beam",
    architecture="BeamForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        SlidingRopeGlobalScaledNope(),
        DepthScaledSandwich(),
        RMSNorm(),
        HeadBiasedGateAttention(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("head"),
        BeamExperts(),
        Value("final_logit_softcapping", "logit_softcap"),
    ],
    maps="sandwich RMSNorms (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, "
         "post_feedforward_layernorm) with depth_scaled_residual; GQA with head_dim, attention_bias -> q/k/v and o "
         "biases, qk_norm RMSNorm per head, output_gate per channel (gate_proj) with output_gate_bias head (gate_bias); "
         "layer_types (default: every sixth and the last layer global) + sliding_window -> per-layer windows, "
         "rope_parameters.sliding_attention -> the rope of the sliding layers, the global ones positional none with "
         "query_length_scale (base 2048, exponent 0.1); ffn moe as DeepSeek-V3's without shared experts: num_experts, "
         "num_experts_per_tok, moe_intermediate_size, router sigmoid_topk (norm_topk_prob, routed_scaling_factor, "
         "n_group, topk_group; e_score_correction_bias -> selection_bias); mlp_layer_types dense -> SwiGLU layers of "
         "intermediate_size; final_logit_softcapping -> logit_softcap",
    caveats="rope_parameters.full_attention must be null; export needs at least one sliding and one moe layer; "
            "aux_loss_coef is 0 on import",
)
