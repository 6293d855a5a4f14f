"""Ergo (``model_type: ergo``, Amazon): sandwich-normed blocks whose adds are learned residual gates, a fused qkv
projection with per-head query/key norms, sliding-window layers with the interleaved rope beside global layers
without positions, a squared-ReLU MLP on the first layers and sigmoid-routed squared-ReLU experts, each expert and
the shared expert ending with an RMSNorm of its own, on the others.

Each residual add is ``sigmoid(w) f + sqrt(1 + sigmoid(w)) exp(-softplus(w) / 2) x`` with a learned ``w`` per channel
(the sandwich's ``residual_gate``). The routed experts' ``up_proj`` is stored ``(experts, hidden, inner)`` and their
``down_proj`` ``(experts, inner, hidden)``: transposed from ours. ``global_attention_scale`` multiplies the global
layers' logits (their queries and keys each by its square root): the attention's ``scale`` there. The LM head is
never tied to the embeddings. ``rope_parameters`` may be flat (the checkpoints': the sliding layers' rope) or keyed by
layer type (``full_attention: null``), as transformers keeps it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_hf.config import ConfigReader
from specformer_hf.families.bailing_hybrid import UntiedHead
from specformer_hf.parts.attention import Attention, QKNorm
from specformer_hf.parts.base import FamilyView, Part, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import plain_sigmoid_router, the_moe_setting
from specformer_hf.parts.norms import RMSNorm, rmsnorm
from specformer_hf.parts.positions import rope, rope_parameters_of
from specformer_hf.parts.windows import layer_types_from_config, windowed
from specformer_hf.rules import Copy, Transposed, TransposedExperts
from specformer_hf.specview import NotExpressible

#: transformers' ErgoConfig defaults (Amazon-FMR/Ergo's sizes, the checkpoint its docstring names).
DEFAULTS = {
    "vocab_size": 262144, "hidden_size": 8192, "num_hidden_layers": 64, "num_attention_heads": 64,
    "num_key_value_heads": 8, "first_dense_intermediate_size": 32768, "num_dense_blocks": 1,
    "moe_intermediate_size": 4096, "shared_intermediate_size": 8192, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_routed_scaling_factor": 8 ** 0.5, "max_position_embeddings": 524288, "rms_norm_eps": 1e-12,
    "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                        "full_attention": None},
    "sliding_window": 512,
    "global_attention_every_n_layers": 4, "global_attention_scale": None, "layer_types": None,
    "mlp_layer_types": None,
}
#: transformers' rope theta where rope_parameters gives none (ErgoConfig.default_theta).
DEFAULT_THETA = 1_000_000.0


@dataclass(frozen=True)
class UntiedSizes(Sizes):
    """Sizes, the head never tied: ErgoConfig has no tie_word_embeddings and ErgoForCausalLM ties nothing."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.data.setdefault("tie_word_embeddings", False)
        super().read(cfg, model)
        UntiedHead().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        UntiedHead().write(view, config)


@dataclass(frozen=True)
class SlidingInterleavedRopeGlobalNope(Part):
    """layer_types (default: every global_attention_every_n_layers-th layer global), sliding_window, rope_parameters
    (flat or keyed by layer type) and global_attention_scale <-> per-layer windows, the interleaved rope on the sliding
    layers, and on the global ones no positions and the score scale head_dim^-0.5 * global_attention_scale."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        every = cfg.get_size("global_attention_every_n_layers")
        types = layer_types_from_config(cfg, ["sliding_attention" if (i + 1) % every else "full_attention"
                                              for i in range(n_layers)])
        stored = cfg.get("rope_parameters") or {"rope_type": "default"}
        if not isinstance(stored, dict):
            raise UserError(f"{cfg.family}: rope_parameters must be a mapping, got {stored!r}")
        if set(stored) & {"sliding_attention", "full_attention"}:
            if stored.get("full_attention") is not None or set(stored) - {"sliding_attention", "full_attention"}:
                raise UserError(f"{cfg.family}: rope_parameters keyed by layer type must be {{sliding_attention: "
                                f"{{...}}, full_attention: null}} (the global layers run without positions), got "
                                f"{stored!r}")
            stored = stored.get("sliding_attention") or {"rope_type": "default"}
        params = {"rope_theta": DEFAULT_THETA, **stored}
        single = ConfigReader({"rope_parameters": params, "max_position_embeddings": cfg.get("max_position_embeddings")},
                              defaults={}, family=f"{cfg.family} (sliding_attention layers)")
        model["positional"] = {**rope(single), "interleaved": True}
        cfg.unused.extend(single.unused)
        windowed(model, [cfg.get("sliding_window") if t == "sliding_attention" else None for t in types])
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        scale = cfg.get("global_attention_scale")
        if full:
            override: dict[str, Any] = {"select": selection(full, n_layers), "positional": "none"}
            if scale is not None:
                head_dim = cfg.get_size("hidden_size") // cfg.get_size("num_attention_heads")
                override["mixer"] = {"scale": float(scale) / head_dim ** 0.5}
            model.setdefault("layers", []).append(override)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("mixer", "window")
        sliding = {w for w in windows if w is not None}
        if len(sliding) != 1:
            raise NotExpressible("model.layers[*].mixer.window", f"Hugging Face {view.name} has one sliding_window on "
                                 f"its local layers, and at least one (got {sorted(sliding) or 'none'})")
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        scales = view.per_layer("mixer", "scale")
        head_dim = view.uniform("mixer", "head_dim") or view.model.d_model // view.uniform("mixer", "n_heads")
        global_scales = set()
        for i, (window, scheme, scale) in enumerate(zip(windows, schemes, scales)):
            local = window is not None
            if scheme["kind"] != ("rope" if local else "none") or (local and scheme != view.positional):
                raise NotExpressible(f"model.layers[{i}].positional", f"Hugging Face {view.name}'s "
                                     + ("sliding layers use the rope (model.positional)" if local else
                                        "global layers use positional none"))
            if local and scale is not None:
                raise NotExpressible(f"model.layers[{i}].mixer.scale", f"Hugging Face {view.name}'s sliding layers "
                                     "score with 1/sqrt(head_dim)")
            if not local:
                global_scales.add(scale)
        if len(global_scales) > 1:
            raise NotExpressible("model.layers[*].mixer.scale", f"Hugging Face {view.name} has one "
                                 "global_attention_scale for all its global layers")
        if not view.positional.get("interleaved"):
            raise NotExpressible("model.positional.interleaved", f"Hugging Face {view.name} rotates adjacent pairs "
                                 "(interleaved: true)")
        params = rope_parameters_of({**view.positional, "interleaved": False}, view.name, path="model.positional",
                                    context_length=view.model.context_length)
        scale = global_scales.pop() if global_scales else None
        config.update(rope_parameters={"sliding_attention": params, "full_attention": None},
                      sliding_window=sliding.pop(),
                      layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows],
                      # 15 significant digits: undoes the last-bit error of dividing by sqrt(head_dim) on import, so
                      # a config's 1.3 comes back as 1.3 and import -> export -> import is exact.
                      global_attention_scale=None if scale is None else float(f"{scale * head_dim ** 0.5:.15g}"))


@dataclass(frozen=True)
class GatedSandwich(Part):
    """Sandwich RMSNorms (Gemma 2's names) whose adds are learned residual gates (``residual_gate``)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["layout"] = {"kind": "sandwich", "residual_gate": True}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("layout", ("sandwich",))
        if not view.uniform("layout", "residual_gate") or view.uniform("layout", "residual_multiplier") != 1.0:
            raise NotExpressible("model.block.layout.residual_gate", f"Hugging Face {view.name} gates every residual "
                                 "add (residual_gate: true, residual_multiplier 1)")



@dataclass(frozen=True)
class ErgoExperts(Part):
    """mlp_layer_types (default: the first num_dense_blocks dense) <-> squared-ReLU MLPs of first_dense_intermediate_size
    on the dense layers, and on the others ffn moe: sigmoid_topk (a selection bias, renormalised, scaled by
    moe_routed_scaling_factor), ungated squared-ReLU experts of moe_intermediate_size with expert_norm rmsnorm, one
    shared expert of shared_intermediate_size."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        dense_first = cfg.get_int("num_dense_blocks")
        types = cfg.get("mlp_layer_types") or ["dense" if i < dense_first else "sparse" for i in range(n_layers)]
        if len(types) != n_layers or set(types) - {"dense", "sparse"}:
            raise UserError(f"{cfg.family}: mlp_layer_types must name 'dense' or 'sparse' for each of the "
                            f"{n_layers} layers, got {types!r}")
        norm = rmsnorm(cfg)
        moe = {"kind": "moe", "n_experts": cfg.get_int("num_experts"), "top_k": cfg.get_int("num_experts_per_tok"),
               "hidden": cfg.get_int("moe_intermediate_size"), "activation": "relu2", "gated": False,
               "router": {"kind": "sigmoid_topk", "normalize": True,
                          "scaling_factor": cfg.get_float("moe_routed_scaling_factor")},
               "n_shared_experts": 1, "shared_hidden": cfg.get_int("shared_intermediate_size"),
               "expert_norm": norm, "aux_loss_coef": 0.0}
        dense_ffn = {"kind": "mlp", "hidden": cfg.get_int("first_dense_intermediate_size"), "activation": "relu2",
                     "bias": False}
        sparse = [i for i, t in enumerate(types) if t == "sparse"]
        dense = [i for i, t in enumerate(types) if t == "dense"]
        # The block's ffn is the one most layers have; the others are overrides.
        base, other, other_ffn = (moe, dense, dense_ffn) if len(sparse) >= len(dense) else (dense_ffn, sparse, moe)
        model.setdefault("block", {})["ffn"] = base
        if other:
            model.setdefault("layers", []).append({"select": selection(other, n_layers), "ffn": other_ffn})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        ffns = view.per_layer("ffn")
        ffn, dense = the_moe_setting(view)
        plain_sigmoid_router(ffn.get("router"), view.name, always_normalize=True, scaled=True)
        wanted = {"gated": False, "activation": "relu2", "n_shared_experts": 1, "expert_bias": False,
                  "swiglu_limit": None, "shared_gate": False, "shared_combine": "sum", "output_norm": None,
                  "output_bias": False}
        for key, value in wanted.items():
            if ffn.get(key, value) != value:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has "
                                     f"{value!r}")
        norm = ffn.get("expert_norm") or {}
        if norm.get("kind") != "rmsnorm" or norm.get("offset", 0.0) or not norm.get("weight", True):
            raise NotExpressible("model.block.ffn.expert_norm", f"Hugging Face {view.name}'s experts each end with an "
                                 "RMSNorm of their own (expert_norm: rmsnorm)")
        block_eps = config.get("rms_norm_eps")  # written by RMSNorm(), before this part
        if block_eps is not None and norm.get("eps", 1e-6) != block_eps:
            raise NotExpressible("model.block.ffn.expert_norm.eps", f"Hugging Face {view.name}'s expert norms share "
                                 f"rms_norm_eps with the block's ({block_eps})")
        if any(f["kind"] != "mlp" or f.get("activation") != "relu2" or f.get("bias", True) for f in dense) \
                or len({f.get("hidden") for f in dense}) > 1:
            raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name}'s dense layers are one ungated "
                                 "squared-ReLU MLP (mlp, activation relu2, bias false) of first_dense_intermediate_size")
        router = ffn["router"]
        config.update(num_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"],
                      moe_intermediate_size=ffn["hidden"] or 4 * view.model.d_model,
                      shared_intermediate_size=ffn.get("shared_hidden") or ffn["hidden"],
                      moe_routed_scaling_factor=router.get("scaling_factor", 1.0),
                      mlp_layer_types=["sparse" if f["kind"] == "moe" else "dense" for f in ffns],
                      num_dense_blocks=sum(1 for f in ffns if f["kind"] != "moe"))
        if dense:
            config["first_dense_intermediate_size"] = dense[0].get("hidden") or 4 * view.model.d_model


#: The checkpoints' names, which transformers renames on load and back on save (its conversion_mapping for ergo: the
#: serving layout of Ergo's training framework). The router and the shared expert are stored (in, out), the routed
#: experts (experts, in, out): transposed from ours; every other tensor as it is (wqkv rows [q; k; v], our qkv).
LAYER = "layers.{i}"
RULES = [
    Copy("tok_embeddings.weight", "embedding.weight"),
    Copy("norm.weight", "final_norm.weight"),
    Copy("output.weight", "lm_head.weight"),
    *(Copy(f"{LAYER}.{theirs}.weight", f"blocks.{{i}}.{ours}.weight") for theirs, ours in (
        ("attention_norm", "attention_norm"), ("post_attention_norm", "attention_post_norm"),
        ("ffn_norm", "ffn_norm"), ("post_ffn_norm", "ffn_post_norm"),
        ("attention.wqkv", "mixer.qkv"), ("attention.wo", "mixer.out"),
        ("attention.q_norm", "mixer.q_norm"), ("attention.k_norm", "mixer.k_norm"),
        ("feed_forward.up", "ffn.fc_in"), ("feed_forward.down", "ffn.fc_out"))),  # up/down: the dense layers
    Copy(f"{LAYER}.post_attention_residual.scale", "blocks.{i}.attention_residual_gate"),
    Copy(f"{LAYER}.post_ffn_residual.scale", "blocks.{i}.ffn_residual_gate"),
    Transposed(f"{LAYER}.feed_forward.gate_kernel", "blocks.{i}.ffn.router.weight"),
    Copy(f"{LAYER}.feed_forward.router_bias", "blocks.{i}.ffn.router.selection_bias"),
    TransposedExperts(f"{LAYER}.feed_forward.up_proj", "blocks.{i}.ffn.experts_in"),
    TransposedExperts(f"{LAYER}.feed_forward.down_proj", "blocks.{i}.ffn.experts_out"),
    Copy(f"{LAYER}.feed_forward.expert_output_norm.scale", "blocks.{i}.ffn.expert_norm_weight"),
    Transposed(f"{LAYER}.feed_forward.shared_up_proj", "blocks.{i}.ffn.shared.fc_in.weight"),
    Transposed(f"{LAYER}.feed_forward.shared_down_proj", "blocks.{i}.ffn.shared.fc_out.weight"),
    Copy(f"{LAYER}.feed_forward.shared_expert_output_norm.scale", "blocks.{i}.ffn.shared_norm.weight"),
]


FAMILY = decoder_family(
    name="Ergo",
    model_type="ergo",
    architecture="ErgoForCausalLM",
    defaults=DEFAULTS,
    parts=[
        UntiedSizes(),
        SlidingInterleavedRopeGlobalNope(),
        GatedSandwich(),
        RMSNorm(),
        Attention(head_dim=False),
        QKNorm("head"),
        ErgoExperts(),
    ],
    rules=RULES,
    maps="sandwich RMSNorms (input_layernorm, post_attention_layernorm, pre_feedforward_layernorm, "
         "post_feedforward_layernorm) with residual_gate (attention_residual_gate, feedforward_residual_gate); GQA with "
         "head_dim hidden / heads, fused qkv_proj, qk_norm RMSNorm per head; layer_types (default: every "
         "global_attention_every_n_layers-th layer global) + sliding_window -> per-layer windows, rope_parameters (flat "
         "or sliding_attention) -> the interleaved rope of the sliding layers, the global ones positional none with "
         "global_attention_scale -> scale head_dim^-0.5 * it; mlp_layer_types (default: num_dense_blocks first dense) "
         "dense -> mlp relu2 of first_dense_intermediate_size; ffn moe: num_experts, num_experts_per_tok, "
         "moe_intermediate_size, ungated relu2 experts (up_proj, down_proj transposed), router sigmoid_topk "
         "(normalised, moe_routed_scaling_factor; e_score_correction_bias -> selection_bias), one shared expert of "
         "shared_intermediate_size, expert_norm rmsnorm (post_expert_norm, shared_experts.norm); untied head; tensors under the "
         "checkpoints' names (tok_embeddings, layers.N.attention.wqkv, feed_forward.gate_kernel, ...), which "
         "transformers renames on load and back on save",
    caveats="rope_parameters.full_attention must be null; export needs at least one sliding and one moe layer; "
            "aux_loss_coef is 0 on import; the router and head run in float32 in transformers (ErgoLinearWithFP32Output), "
            "ours in the model's dtype",
)
