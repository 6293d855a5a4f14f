"""Cohere2-MoE (``model_type: cohere2_moe``, Command A MoE): Cohere2's parallel blocks and sliding/global layers over a
mixture of SwiGLU experts whose shared experts are averaged with the routed mix, after optional dense layers.

Each sparse layer routes a token to ``num_experts_per_tok`` of ``num_experts`` experts (the best
logits) weighed, with ``expert_selection_fn`` ``softmax``, by a softmax over those top-k logits (the
renormalised softmax top-k), with ``sigmoid`` by their sigmoids, divided by their sum when
``norm_topk_prob`` (our ``sigmoid_topk`` with ``selection_bias: false``; the sigmoid is monotone, so
choosing by logit or by score is the same choice) and, with ``num_shared_experts`` > 0, runs one
SwiGLU ``num_shared_experts * intermediate_size`` wide beside them; ``shared_expert_combination_strategy``
``average`` takes ``(routed + shared) / 2`` (the moe's ``shared_combine``), ``sum`` their sum. Dense
layers (``mlp_layer_types``) are SwiGLUs ``prefix_dense_intermediate_size`` wide; with
``prefix_dense_sliding_window_pattern`` 1 their global layers keep the rope, which Cohere2's global
layers otherwise drop. The norms are RMSNorms when ``rms_norm_eps`` is set, else Cohere's bias-free
LayerNorm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_layers import default_gated_hidden

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import MLP, FamilyView, Part, Switch, Value, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GATED_KIND, GatedFFN, expert_rules, plain_sigmoid_router, shared_halves
from specformer_hf.parts.norms import LayerNorm, Layout, RMSNorm
from specformer_hf.parts.positions import rope, rope_parameters_of
from specformer_hf.parts.windows import layer_types_from_config, windowed
from specformer_hf.rules import Copy, Fused, Rule
from specformer_hf.specview import NotExpressible

#: transformers' Cohere2MoeConfig defaults.
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "logit_scale": 0.0625,
    "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": None, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "tie_word_embeddings": True,
    "attention_bias": False, "sliding_window": 4096, "num_experts_per_tok": 2, "num_experts": 8,
    "num_shared_experts": 0, "shared_expert_combination_strategy": "average", "expert_selection_fn": "softmax",
    "layer_types": None, "mlp_layer_types": None, "prefix_dense_sliding_window_pattern": 1, "norm_topk_prob": True,
    "prefix_dense_intermediate_size": None, "rms_norm_eps": None, "sliding_window_pattern": 4,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def mlp_layer_types(cfg: ConfigReader, n_layers: int) -> list[str]:
    """Each layer's "dense" or "sparse": mlp_layer_types, else the first first_k_dense_replace layers dense (the
    keyword transformers' config turns into mlp_layer_types and does not keep)."""
    types = cfg.get("mlp_layer_types")
    if types is None:
        dense = cfg.get_int("first_k_dense_replace", 0)
        return ["dense" if i < dense else "sparse" for i in range(n_layers)]
    cfg.mark_read("first_k_dense_replace")
    if not isinstance(types, list) or len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
        raise UserError(f"{cfg.family}: mlp_layer_types must give 'dense' or 'sparse' for each of the {n_layers} "
                        f"layers, got {types!r}")
    return list(types)


@dataclass(frozen=True)
class Cohere2MoeNorms(Part):
    """rms_norm_eps set: RMSNorm everywhere; null: Cohere's bias-free LayerNorm with layer_norm_eps."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get("rms_norm_eps") is not None:
            cfg.mark_read("layer_norm_eps")
            RMSNorm().read(cfg, model)
        else:
            LayerNorm(bias=False).read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if view.block_kind("norm", ("rmsnorm", "layernorm")) == "rmsnorm":
            RMSNorm().write(view, config)
        else:
            LayerNorm(bias=False).write(view, config)
            config["rms_norm_eps"] = None


@dataclass(frozen=True)
class Cohere2MoePositions(Part):
    """layer_types (default: every sliding_window_pattern-th layer global, the first first_k_dense_replace ones by
    prefix_dense_sliding_window_pattern), sliding_window, rope_parameters <-> per-layer windows, the interleaved rope
    on sliding layers and on the dense layers when prefix_dense_sliding_window_pattern is 1, none on the others."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        dense_pattern, pattern = cfg.get_size("prefix_dense_sliding_window_pattern"), cfg.get_size("sliding_window_pattern")
        first_dense = cfg.get_int("first_k_dense_replace", 0)
        default = ["sliding_attention" if (i + 1) % dense_pattern else "full_attention" for i in range(first_dense)]
        default += ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers - first_dense)]
        types = layer_types_from_config(cfg, default)
        forced = dense_pattern == 1
        dense = mlp_layer_types(cfg, n_layers)
        window = cfg.get("sliding_window")
        model["positional"] = {**rope(cfg), "interleaved": True}
        windowed(model, [window if t == "sliding_attention" else None for t in types])
        nope = [i for i, t in enumerate(types) if t == "full_attention" and not (forced and dense[i] == "dense")]
        if nope:
            model.setdefault("layers", []).append({"select": selection(nope, n_layers), "positional": "none"})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("mixer", "window")
        dense = [kind != "moe" for kind in view.per_layer("ffn", "kind")]
        sliding = {w for w in windows if w is not None}
        if len(sliding) > 1:
            raise NotExpressible("model.layers[*].mixer.window", f"Hugging Face {view.name} has one sliding_window "
                                 f"(got {sorted(sliding)})")
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        dense_global_rope = {scheme["kind"] == "rope" for window, scheme, d in zip(windows, schemes, dense)
                             if d and window is None}
        if len(dense_global_rope) > 1:
            raise NotExpressible("model.layers[*].positional", f"Hugging Face {view.name}'s dense global layers all "
                                 "keep the rope (prefix_dense_sliding_window_pattern 1) or all drop it")
        forced = dense_global_rope != {False}
        for i, (window, scheme, d) in enumerate(zip(windows, schemes, dense)):
            wanted = "rope" if window is not None or (forced and d) else "none"
            if scheme["kind"] != wanted or (wanted == "rope" and scheme != view.positional):
                raise NotExpressible(f"model.layers[{i}].positional", f"Hugging Face {view.name}'s sliding layers "
                                     "(and dense layers, all or none of them) use model.positional, its other "
                                     "layers none")
        pos = view.positional
        if not pos.get("interleaved"):
            raise NotExpressible("model.positional.interleaved", f"Hugging Face {view.name} rotates adjacent pairs "
                                 "(interleaved: true)")
        params = rope_parameters_of({**pos, "interleaved": False}, view.name, path="model.positional",
                                    context_length=view.model.context_length)
        # Any pattern but 1 leaves the dense global layers without the rope; 2 is one such (layer_types are written).
        config.update(rope_parameters=params, sliding_window=sliding.pop() if sliding else None,
                      prefix_dense_sliding_window_pattern=1 if forced else 2,
                      layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])


@dataclass(frozen=True)
class Cohere2MoeExperts(Part):
    """num_experts, num_experts_per_tok, intermediate_size, expert_selection_fn, norm_topk_prob, num_shared_experts,
    shared_expert_combination_strategy, mlp_layer_types and prefix_dense_intermediate_size <-> ffn moe (softmax top-k
    renormalised, or a sigmoid_topk router without a selection bias) and dense swiglu layers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        activation = activation_from_hf(cfg, "hidden_act")
        hidden = cfg.get_int("intermediate_size")
        selection_fn = cfg.require("expert_selection_fn", ("softmax", "sigmoid"),
                                   why="transformers' Cohere2-MoE accepts these two")
        ffn: dict[str, Any] = {
            "kind": "moe", "n_experts": cfg.get_int("num_experts"), "top_k": cfg.get_int("num_experts_per_tok"),
            "hidden": hidden, "activation": activation, "gated": True,
            "aux_loss_coef": 0.0,  # transformers' Cohere2-MoE trains without a load-balancing loss
        }
        if selection_fn == "sigmoid":
            ffn["router"] = {"kind": "sigmoid_topk", "selection_bias": False,
                             "normalize": bool(cfg.get("norm_topk_prob"))}
        else:
            # The softmax of the top-k logits always sums to one: norm_topk_prob only matters for the sigmoid router.
            cfg.mark_read("norm_topk_prob")
            ffn["routing"] = "topk_then_softmax"
        n_shared = cfg.get_int("num_shared_experts")
        combine = cfg.require("shared_expert_combination_strategy", ("average", "sum"),
                              why="transformers' Cohere2-MoE accepts these two")
        if n_shared:
            ffn.update(n_shared_experts=n_shared, shared_hidden=n_shared * hidden, shared_combine=combine)
        model.setdefault("block", {})["ffn"] = ffn
        n_layers = cfg.get_layers("num_hidden_layers")
        dense = [i for i, t in enumerate(mlp_layer_types(cfg, n_layers)) if t == "dense"]
        width = cfg.get("prefix_dense_intermediate_size")
        if dense:
            swiglu = {"kind": GATED_KIND.get(activation, "swiglu"), "hidden": width or hidden, "activation": activation}
            model.setdefault("layers", []).append({"select": selection(dense, n_layers), "ffn": swiglu})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = view.per_layer("ffn", "kind")
        moe = [layer["ffn"] for layer in view.view.layers if layer["ffn"]["kind"] == "moe"]
        if not moe:
            raise NotExpressible("model.block.ffn.kind", f"Hugging Face {view.name} needs mixture-of-experts layers (moe)")
        strip = lambda f: {k: v for k, v in f.items() if k != "aux_loss_coef"}  # noqa: E731
        if any(strip(f) != strip(moe[0]) for f in moe[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {view.name} has one setting")
        ffn = moe[0]
        if ffn.get("router") is not None:
            normalize = plain_sigmoid_router(ffn["router"], view.name, always_normalize=False, selection_bias=False)
            config.update(expert_selection_fn="sigmoid", norm_topk_prob=normalize)
        elif ffn["routing"] != "topk_then_softmax" or not ffn["normalize_topk"]:
            raise NotExpressible("model.block.ffn.routing", f"Hugging Face {view.name} routes by a softmax over the top-k "
                                 "logits (routing: topk_then_softmax, normalize_topk: true) or by a sigmoid_topk router "
                                 "without a selection bias")
        else:
            config["expert_selection_fn"] = "softmax"
        for key, wanted in (("expert_bias", False), ("swiglu_limit", None), ("gated", True), ("shared_gate", False)):
            if ffn.get(key, wanted) != wanted:
                raise NotExpressible(f"model.block.ffn.{key}", f"{ffn.get(key)!r}: Hugging Face {view.name} has {wanted!r}")
        hidden = ffn["hidden"] or default_gated_hidden(view.model.d_model)
        n_shared = ffn.get("n_shared_experts", 0)
        if n_shared and (ffn.get("shared_hidden") or n_shared * hidden) != n_shared * hidden:
            raise NotExpressible("model.block.ffn.shared_hidden", f"Hugging Face {view.name}'s shared experts are "
                                 "n_shared_experts * hidden wide")
        config.update(num_experts=ffn["n_experts"], num_experts_per_tok=ffn["top_k"], intermediate_size=hidden,
                      hidden_act=ACTIVATIONS_TO_HF[ffn["activation"]],
                      num_shared_experts=n_shared,
                      shared_expert_combination_strategy=ffn.get("shared_combine", "sum") if n_shared else "average",
                      mlp_layer_types=["sparse" if k == "moe" else "dense" for k in kinds])
        dense = [view.view.layers[i]["ffn"] for i, k in enumerate(kinds) if k != "moe"]
        for d in dense:
            if d["kind"] not in ("swiglu", "geglu", "reglu") or d.get("bias") or d["activation"] != ffn["activation"]:
                raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name}'s dense layers are bias-free "
                                     "gated feed-forwards with the experts' activation")
        widths = {d.get("hidden") or default_gated_hidden(view.model.d_model) for d in dense}
        if len(widths) > 1:
            raise NotExpressible("model.layers[*].ffn.hidden", f"dense layers of widths {sorted(widths)}; Hugging Face "
                                 f"{view.name} has one prefix_dense_intermediate_size")
        config["prefix_dense_intermediate_size"] = widths.pop() if widths else None

    def rules(self) -> list[Rule]:
        return [
            *expert_rules(saved=MLP),
            Fused([f"{MLP}.shared_experts.gate_proj.weight", f"{MLP}.shared_experts.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{MLP}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
            *GatedFFN().rules(),  # the dense layers
        ]


FAMILY = decoder_family(
    name="Cohere2-MoE",
    model_type="cohere2_moe",
    architecture="Cohere2MoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Cohere2MoePositions(),
        Layout("parallel"),
        Cohere2MoeNorms(),
        Attention(),
        Cohere2MoeExperts(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Value("logit_scale", "logit_scale"),
    ],
    maps="as Cohere2 (layout parallel with one shared norm, logit_scale, GQA with head_dim, attention_bias, interleaved "
         "rope on sliding layers, none on global ones) with ffn moe: num_experts, num_experts_per_tok, intermediate_size, "
         "expert_selection_fn softmax (softmax of the top-k logits) or sigmoid (router sigmoid_topk with selection_bias "
         "false, normalize from norm_topk_prob), num_shared_experts (one SwiGLU num_shared_experts * intermediate_size wide), "
         "shared_expert_combination_strategy -> shared_combine (average: (routed + shared) / 2); mlp_layer_types / "
         "first_k_dense_replace -> dense layers (prefix_dense_intermediate_size), which keep the rope on global layers "
         "when prefix_dense_sliding_window_pattern is 1; rms_norm_eps set -> rmsnorm, else bias-free layernorm",
    caveats="aux_loss_coef is 0 on import (transformers' model computes no load-balancing loss)",
)
