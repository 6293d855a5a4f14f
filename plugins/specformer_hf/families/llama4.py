"""Llama 4, text (``model_type: llama4_text``, ``Llama4ForCausalLM``): chunked local attention with interleaved rope
and l2-normalised queries and keys, every few layers a global NoPE layer with temperature-tuned queries, and a
mixture of experts (top-1 sigmoid routing that scales the expert's input, plus a shared expert) on every layer or
every other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_layers import default_gated_hidden

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import LAYER, FamilyView, Part, Switch, per_layer_overrides, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GATED_KIND
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import no_rope_flags, rope, rope_parameters_of
from specformer_hf.rules import Copy, Fused, Rule, Site, TransposedExperts
from specformer_hf.specview import NotExpressible

#: transformers' Llama4TextConfig defaults (Llama 4 Scout's text model).
DEFAULTS = {
    "vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128,
    "hidden_act": "silu", "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "num_experts_per_tok": 1, "num_local_experts": 16, "moe_layers": None, "interleave_moe_layer_step": 1,
    "use_qk_norm": True, "router_aux_loss_coef": 0.001, "no_rope_layers": None, "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192, "layer_types": None, "attn_temperature_tuning": True, "floor_scale": 8192,
    "attn_scale": 0.1, "attention_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}

FF = f"{LAYER}.feed_forward"


@dataclass(frozen=True)
class LocalAndGlobalLayers(Part):
    """rope_parameters, no_rope_layers (or no_rope_layer_interval), layer_types (or attention_chunk_size on the rope
    layers), use_qk_norm, attn_temperature_tuning, floor_scale, attn_scale <-> an interleaved rope, ``positional:
    none`` on the NoPE layers, per-layer ``mixer.chunk``, ``qk_norm: l2norm`` on the rope layers and
    ``temperature_tuning`` on the NoPE layers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        uses_rope = [bool(f) for f in no_rope_flags(cfg, n_layers)]
        chunk = cfg.get("attention_chunk_size")
        types = cfg.get("layer_types") or ["chunked_attention" if r and chunk is not None else "full_attention"
                                           for r in uses_rope]
        if len(types) != n_layers or not set(types) <= {"chunked_attention", "full_attention"}:
            raise UserError(f"{cfg.family}: layer_types must name chunked_attention or full_attention for each of the "
                            f"{n_layers} layers, got {types!r}")
        if "chunked_attention" in types:
            chunk = cfg.get_size("attention_chunk_size")
        qk_norm = {"kind": "l2norm", "eps": cfg.get_float("rms_norm_eps")} if cfg.get("use_qk_norm") else None
        tuning = bool(cfg.get("attn_temperature_tuning"))
        floor_scale, attn_scale = cfg.get_float("floor_scale"), cfg.get_float("attn_scale")
        per_layer = []
        for rotary, kind in zip(uses_rope, types):
            attention: dict[str, Any] = {"chunk": chunk if kind == "chunked_attention" else None,
                                         "qk_norm": qk_norm if rotary else None,
                                         "temperature_tuning": tuning and not rotary}
            if tuning and not rotary:
                attention.update(temperature_floor_scale=floor_scale, temperature_attn_scale=attn_scale)
            per_layer.append(attention)
        per_layer_overrides(model, "mixer", per_layer, n_layers)
        model["positional"] = {**rope(cfg), "interleaved": True}  # Llama 4 turns adjacent pairs (complex numbers)
        nope = [i for i, rotary in enumerate(uses_rope) if not rotary]
        if nope:
            model.setdefault("layers", []).append({"select": selection(nope, n_layers), "positional": "none"})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        name, pos = view.name, view.positional
        schemes = [scheme or pos for scheme in view.per_layer("positional")]
        for i, scheme in enumerate(schemes):
            if scheme["kind"] != "none" and scheme != pos:
                raise NotExpressible(f"model.layers[{i}].positional", f"Hugging Face {name}'s layers use "
                                     "model.positional or none (NoPE)")
        if not pos.get("interleaved"):
            raise NotExpressible("model.positional.interleaved", f"Hugging Face {name} rotates adjacent pairs (interleaved: true)")
        rotary = [scheme["kind"] != "none" for scheme in schemes]
        attentions = view.per_layer("mixer")
        chunks = {a.get("chunk") for a in attentions} - {None}
        if len(chunks) > 1:
            raise NotExpressible("model.layers[*].mixer.chunk", f"several chunk sizes {sorted(chunks)}; Hugging Face "
                                 f"{name} has one attention_chunk_size")
        norms = {_key(a.get("qk_norm")) for a, r in zip(attentions, rotary) if r}
        if any(a.get("qk_norm") for a, r in zip(attentions, rotary) if not r) or len(norms) > 1:
            raise NotExpressible("model.layers[*].mixer.qk_norm", f"Hugging Face {name} normalises queries and keys "
                                 "on every rope layer alike (use_qk_norm) and never on its NoPE layers")
        qk_norm = next(iter(norms), None)
        eps = None
        if qk_norm is not None:
            norm = dict(qk_norm)
            if norm["kind"] != "l2norm" or view.uniform("mixer", "qk_norm_scope") != "head":
                raise NotExpressible("model.block.mixer.qk_norm", f"Hugging Face {name}'s qk norm is l2norm per head")
            eps = norm["eps"]
        tunings = {(a["temperature_floor_scale"], a["temperature_attn_scale"]) if a.get("temperature_tuning") else None
                   for a, r in zip(attentions, rotary) if not r}
        if any(a.get("temperature_tuning") for a, r in zip(attentions, rotary) if r) or len(tunings) > 1:
            raise NotExpressible("model.layers[*].mixer.temperature_tuning", f"Hugging Face {name} tunes the "
                                 "temperature of every NoPE layer alike (attn_temperature_tuning) and of no rope layer")
        tuning = next(iter(tunings), None)
        if eps is not None and eps != view.uniform("norm", "eps"):
            raise NotExpressible("model.block.mixer.qk_norm.eps", f"Hugging Face {name}'s qk norm uses rms_norm_eps "
                                 f"({view.uniform('norm', 'eps')})")
        params = rope_parameters_of({**pos, "interleaved": False}, name, path="model.positional",
                                    context_length=view.model.context_length)
        config.update(
            rope_parameters=params, no_rope_layers=[int(r) for r in rotary], use_qk_norm=qk_norm is not None,
            attention_chunk_size=chunks.pop() if chunks else None, attn_temperature_tuning=tuning is not None,
            layer_types=["chunked_attention" if a.get("chunk") else "full_attention" for a in attentions],
        )
        if tuning is not None:
            floor_scale, attn_scale = tuning
            config.update(floor_scale=int(floor_scale) if float(floor_scale).is_integer() else floor_scale,
                          attn_scale=attn_scale)


def _key(d: dict[str, Any] | None) -> tuple | None:
    return None if d is None else tuple(sorted(d.items()))


@dataclass(frozen=True)
class Experts(Part):
    """num_local_experts, num_experts_per_tok, intermediate_size, intermediate_size_mlp, hidden_act, moe_layers (or
    interleave_moe_layer_step) <-> ``moe`` layers (router topk_sigmoid, one shared expert of the experts' width)
    and ``swiglu`` layers of width intermediate_size_mlp."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        activation = activation_from_hf(cfg, "hidden_act")
        step = cfg.get_size("interleave_moe_layer_step")
        moe_layers = cfg.get("moe_layers")
        if moe_layers is None:
            moe_layers = list(range(step - 1, n_layers, step))
        if not isinstance(moe_layers, list) or not all(isinstance(i, int) and 0 <= i < n_layers for i in moe_layers):
            raise UserError(f"{cfg.family}: moe_layers must list layer indices below {n_layers}, got {moe_layers!r}")
        moe = {"kind": "moe", "n_experts": cfg.get_int("num_local_experts"), "top_k": cfg.get_int("num_experts_per_tok"),
               "hidden": cfg.get_int("intermediate_size"), "activation": activation, "gated": True,
               "n_shared_experts": 1, "router": {"kind": "topk_sigmoid"},
               "aux_loss_coef": cfg.get_float("router_aux_loss_coef")}
        dense = {"kind": GATED_KIND.get(activation, "swiglu"), "hidden": cfg.get_int("intermediate_size_mlp"),
                 "activation": activation}
        per_layer_overrides(model, "ffn", [moe if i in moe_layers else dense for i in range(n_layers)], n_layers)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        name, n_layers = view.name, view.model.n_layers
        ffns = view.per_layer("ffn")
        moe_layers = [i for i, f in enumerate(ffns) if f["kind"] == "moe"]
        dense = [f for f in ffns if f["kind"] != "moe"]
        if not moe_layers:
            raise NotExpressible("model.block.ffn.kind", f"Hugging Face {name} needs mixture-of-experts layers (moe)")
        moes = [ffns[i] for i in moe_layers]
        if any(f != moes[0] for f in moes[1:]):
            raise NotExpressible("model.layers[*].ffn", f"the moe layers differ; Hugging Face {name} has one expert setting")
        moe = moes[0]
        router = moe.get("router") or {}
        if router.get("kind") != "topk_sigmoid" or router.get("weights_on") != "input":
            raise NotExpressible("model.block.ffn.router", f"Hugging Face {name} routes with topk_sigmoid (weights_on: input)")
        hidden = moe["hidden"] or default_gated_hidden(view.model.d_model)
        wanted = {"gated": True, "expert_bias": False, "swiglu_limit": None, "n_shared_experts": 1, "shared_gate": False}
        for key, value in wanted.items():
            if moe.get(key) != value:
                raise NotExpressible(f"model.block.ffn.{key}", f"{moe.get(key)!r}: Hugging Face {name} has {value!r}")
        if (moe.get("shared_hidden") or hidden) != hidden:
            raise NotExpressible("model.block.ffn.shared_hidden", f"Hugging Face {name}'s shared expert is as wide as "
                                 f"each routed one ({hidden})")
        activations = {moe["activation"], *(f.get("activation") for f in dense)}
        widths = {f.get("hidden") or default_gated_hidden(view.model.d_model) for f in dense}
        if any(f["kind"] not in ("swiglu", "geglu", "reglu") or f.get("bias") for f in dense) or len(activations) > 1:
            raise NotExpressible("model.layers[*].ffn", f"Hugging Face {name}'s dense layers are gated, bias-free and "
                                 "share the experts' activation")
        if len(widths) > 1:
            raise NotExpressible("model.layers[*].ffn.hidden", f"dense layers of widths {sorted(widths)}; Hugging Face "
                                 f"{name} has one intermediate_size_mlp")
        step = moe_layers[1] - moe_layers[0] if len(moe_layers) > 1 else n_layers
        interleaved = moe_layers == list(range(step - 1, n_layers, step))
        config.update(
            num_local_experts=moe["n_experts"], num_experts_per_tok=moe["top_k"], intermediate_size=hidden,
            intermediate_size_mlp=widths.pop() if widths else hidden, hidden_act=ACTIVATIONS_TO_HF[moe["activation"]],
            router_aux_loss_coef=moe["aux_loss_coef"], interleave_moe_layer_step=step if interleaved else 1,
            moe_layers=moe_layers,
        )

    def rules(self) -> list[Rule]:
        def halves(site: Site) -> tuple[int, int]:
            return site.ffn.hidden, site.ffn.hidden

        def shared_halves(site: Site) -> tuple[int, int]:
            return site.ffn.shared.hidden, site.ffn.shared.hidden

        return [
            # dense layers (a rule whose parameters a layer lacks is skipped)
            Fused([f"{FF}.gate_proj.weight", f"{FF}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
            Copy(f"{FF}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
            # experts: (E, d_model, 2 * hidden) with [gate | up] columns, and (E, hidden, d_model): ours transposed
            Copy(f"{FF}.router.weight", "blocks.{i}.ffn.router.weight"),
            TransposedExperts(f"{FF}.experts.gate_up_proj", "blocks.{i}.ffn.experts_in"),
            TransposedExperts(f"{FF}.experts.down_proj", "blocks.{i}.ffn.experts_out"),
            Fused([f"{FF}.shared_expert.gate_proj.weight", f"{FF}.shared_expert.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{FF}.shared_expert.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
        ]


@dataclass(frozen=True)
class OneOverridePerSelection(Part):
    """The ``layers:`` overrides the parts above wrote for the same layers, merged into one (reading only)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        merged: list[dict[str, Any]] = []
        for override in model.get("layers", []):
            same = next((m for m in merged if m["select"] == override["select"] and not (set(m) & set(override)) - {"select"}), None)
            if same is None:
                merged.append(dict(override))
            else:
                same.update(override)
        if merged:
            model["layers"] = merged


FAMILY = decoder_family(
    name="Llama 4",
    model_type="llama4_text",
    architecture="Llama4ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        LocalAndGlobalLayers(),
        Layout("prenorm"),
        RMSNorm(),
        Attention(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Experts(),
        OneOverridePerSelection(),
    ],
    maps="rope_parameters -> interleaved rope; no_rope_layers / no_rope_layer_interval -> positional none on the NoPE "
         "layers; layer_types / attention_chunk_size -> mixer.chunk; use_qk_norm -> qk_norm l2norm on the rope "
         "layers; attn_temperature_tuning, floor_scale, attn_scale -> temperature tuning on the NoPE layers; "
         "moe_layers / interleave_moe_layer_step -> moe layers (num_local_experts, num_experts_per_tok, "
         "intermediate_size, router topk_sigmoid, one shared expert) beside swiglu layers of intermediate_size_mlp",
    caveats="text only (Llama4ForCausalLM; a Llama4ForConditionalGeneration checkpoint's vision tower is not read); "
            "the temperature tuning reads each token's absolute position where transformers reads its cache slot: "
            "the same without left padding",
)
