"""Pieces most families share: sizes, gated feed-forwards, RoPE, sliding windows, Llama-style tensor names.

Each helper does one mapping in both directions so a family module can read as a
list of what its config and checkpoint contain.
"""

from __future__ import annotations

from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf, rope_parameters
from specformer_hf.rules import Copy, Fused, Rule, halves, qkv_sizes
from specformer_hf.specview import NotExpressible, SpecView

GATED_FFNS = ("swiglu", "geglu", "reglu")
_GATED_KIND = {"silu": "swiglu", "gelu": "geglu", "gelu_tanh": "geglu", "relu": "reglu"}


# -- sizes --------------------------------------------------------------------------------


def model_sizes(cfg: ConfigReader) -> dict[str, Any]:
    """The spec's top-level sizes and head tying."""
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": cfg.get_int("hidden_size"),
        "n_layers": cfg.get_layers("num_hidden_layers"),
        "context_length": cfg.get_int("max_position_embeddings"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
    }


def model_sizes_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "num_hidden_layers": m.n_layers,
        "max_position_embeddings": m.context_length,
        "tie_word_embeddings": m.tie_embeddings,
    }


def attention_sizes(cfg: ConfigReader) -> dict[str, Any]:
    """n_heads, n_kv_heads, head_dim of the attention (head_dim: null means hidden / heads)."""
    n_heads = cfg.get_size("num_attention_heads")
    n_kv = cfg.get("num_key_value_heads", None) or n_heads
    head_dim = cfg.get("head_dim", None) or cfg.get_size("hidden_size") // n_heads
    return {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_kv, "head_dim": head_dim}


def attention_sizes_config(view: SpecView, family: str) -> dict[str, Any]:
    view.block_kind("attention", ("attention",), family=family)
    for key in ("n_heads", "n_kv_heads", "head_dim"):
        view.uniform("attention", key, family=family)
    n_heads, n_kv, head_dim = view.attention_sizes()
    return {"num_attention_heads": n_heads, "num_key_value_heads": n_kv, "head_dim": head_dim}


# -- feed-forward -----------------------------------------------------------------------------


def gated_ffn(cfg: ConfigReader, *, act_key: str = "hidden_act", bias: bool = False) -> dict[str, Any]:
    activation = activation_from_hf(cfg, act_key)
    kind = _GATED_KIND.get(activation, "swiglu")
    return {"kind": kind, "hidden": cfg.get_int("intermediate_size"), "activation": activation, "bias": bias}


def gated_ffn_config(view: SpecView, family: str, *, act_key: str = "hidden_act") -> dict[str, Any]:
    view.block_kind("ffn", GATED_FFNS, family=family)
    hidden = view.uniform("ffn", "hidden", family=family) or default_gated_hidden(view.model.d_model)
    return {"intermediate_size": hidden, act_key: ACTIVATIONS_TO_HF[view.uniform("ffn", "activation", family=family)]}


def default_gated_hidden(d_model: int) -> int:
    """The width a gated feed-forward (or gated experts) with ``hidden: null`` builds."""
    from specformer_layers.ffn.gated import default_gated_hidden as layers_default

    return layers_default(d_model)


# -- norms ----------------------------------------------------------------------------------


def rmsnorm(cfg: ConfigReader, *, eps_key: str = "rms_norm_eps", offset: float = 0.0) -> dict[str, Any]:
    norm: dict[str, Any] = {"kind": "rmsnorm", "eps": cfg.get_float(eps_key)}
    if offset:
        norm["offset"] = offset
    return norm


def rmsnorm_config(view: SpecView, family: str, *, eps_key: str = "rms_norm_eps") -> dict[str, Any]:
    view.block_kind("norm", ("rmsnorm",), family=family)
    return {eps_key: view.uniform("norm", "eps", family=family)}


# -- rotary positions -----------------------------------------------------------------------------

#: transformers rope_type -> (specformer rope_scaling kind, {config key: param}); "default" has no scaling.
ROPE_SCALINGS: dict[str, tuple[str, dict[str, str]]] = {
    "linear": ("linear", {"factor": "factor"}),
    "dynamic": ("dynamic", {"factor": "factor"}),
    "yarn": ("yarn", {
        "factor": "factor", "original_max_position_embeddings": "original_context_length", "beta_fast": "beta_fast",
        "beta_slow": "beta_slow", "mscale": "mscale", "mscale_all_dim": "mscale_all_dim",
        "attention_factor": "attention_factor", "truncate": "truncate",
    }),
    "llama3": ("llama3", {
        "factor": "factor", "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
        "original_max_position_embeddings": "original_context_length",
    }),
    "longrope": ("longrope", {
        "short_factor": "short_factor", "long_factor": "long_factor", "factor": "factor",
        "original_max_position_embeddings": "original_context_length", "attention_factor": "attention_factor",
    }),
}
ROPE_TYPES = ("default", *ROPE_SCALINGS)
#: Scalings whose original context transformers takes from the rope parameters (else max_position_embeddings).
_NEEDS_ORIGINAL = ("yarn", "llama3", "longrope")


def rope(cfg: ConfigReader, *, rope_types: tuple[str, ...] = ROPE_TYPES, extra_legacy: dict[str, str] | None = None,
         original_override: str | None = None, partial: bool = False) -> dict[str, Any]:
    """The ``rope`` positional scheme of a config's rope parameters (theta, partial rotary, scaling).

    ``original_override`` names a top-level config field that, when the family's config has
    it, replaces the rope parameters' original_max_position_embeddings (Phi-3). ``partial``:
    whether the family's attention rotates part of each head (GPT-NeoX, Phi-3); the others
    rotate whole heads whatever partial_rotary_factor says.
    """
    params = rope_parameters(cfg, extra_legacy={"partial_rotary_factor": "partial_rotary_factor", **(extra_legacy or {})})
    rope_type = params.pop("rope_type")
    if rope_type not in rope_types:
        raise UserError(
            f"{cfg.family}: rope_type {rope_type!r} (config.json rope_parameters/rope_scaling) is not supported; "
            f"supported: {', '.join(rope_types)}"
        )
    out: dict[str, Any] = {"kind": "rope", "theta": float(params.pop("rope_theta"))}
    fraction = float(params.pop("partial_rotary_factor", 1.0) or 1.0)
    if fraction != 1.0:
        if not partial:
            raise UserError(
                f"{cfg.family}: partial_rotary_factor {fraction} is not supported: transformers' {cfg.family} "
                "rotates whole heads (GPT-NeoX and Phi-3 rotate part of each head)"
            )
        out["fraction"] = fraction
    if rope_type == "default":
        _warn_unused(cfg, rope_type, params)
        return out
    kind, names = ROPE_SCALINGS[rope_type]
    if rope_type in _NEEDS_ORIGINAL:
        if original_override and cfg.get(original_override, None) is not None:
            params["original_max_position_embeddings"] = cfg.get(original_override)
        params.setdefault("original_max_position_embeddings", cfg.get_int("max_position_embeddings"))
    scaling = {"kind": kind}
    for key, name in names.items():
        if params.get(key) is not None:
            scaling[name] = params.pop(key)
        else:
            params.pop(key, None)
    _warn_unused(cfg, rope_type, params)
    out["scaling"] = scaling
    return out


def _warn_unused(cfg: ConfigReader, rope_type: str, params: dict[str, Any]) -> None:
    for key in params:  # transformers ignores them too (with a warning of its own)
        cfg.note_unused(f"rope_parameters.{key} (not used by rope_type {rope_type!r})")


def rope_config(view: SpecView, family: str, *, legacy_theta: str | None = "rope_theta",
                rope_types: tuple[str, ...] = ROPE_TYPES, partial: bool = False) -> dict[str, Any]:
    """``rope_parameters`` (transformers 5) plus the legacy fields transformers 4 reads."""
    pos = view.expect(view.positional, "model.positional", ("rope",), family=family)
    if pos.get("interleaved"):
        raise NotExpressible("model.positional.interleaved", f"interleaved (GPT-J style) rotary pairs have no equivalent in Hugging Face {family}")
    params: dict[str, Any] = {"rope_type": "default", "rope_theta": pos["theta"]}
    if pos.get("fraction", 1.0) != 1.0:
        if not partial:
            raise NotExpressible("model.positional.fraction", f"{pos['fraction']}: Hugging Face {family} rotates whole heads")
        params["partial_rotary_factor"] = pos["fraction"]
    scaling = pos.get("scaling")
    if scaling:
        rope_type = next((t for t, (kind, _) in ROPE_SCALINGS.items() if kind == scaling["kind"]), None)
        if rope_type is None or rope_type not in rope_types:
            raise NotExpressible("model.positional.scaling.kind", f"{scaling['kind']!r} has no equivalent in Hugging Face {family}")
        params["rope_type"] = rope_type
        if rope_type == "dynamic" and scaling.get("original_context_length") not in (None, view.model.context_length):
            raise NotExpressible(
                "model.positional.scaling.original_context_length",
                f"Hugging Face dynamic scaling starts at max_position_embeddings (the context_length, {view.model.context_length})",
            )
        for key, name in ROPE_SCALINGS[rope_type][1].items():
            if scaling.get(name) is not None:
                params[key] = scaling[name]
    out: dict[str, Any] = {"rope_parameters": params}
    if scaling:
        out["rope_scaling"] = dict(params)  # transformers 4 reads this (5 too, and finds the same)
    elif legacy_theta:
        out[legacy_theta] = pos["theta"]
    return out


# -- sliding windows ------------------------------------------------------------------------------


def window_layers(base_window: int | None, windows: list[int | None]) -> list[dict[str, Any]]:
    """Per-layer overrides giving layer i ``windows[i]`` when the block's window is ``base_window``."""
    overrides = []
    for window in sorted({w for w in windows if w != base_window}, key=lambda w: (w is None, w or 0)):
        indices = [i for i, w in enumerate(windows) if w == window]
        overrides.append({"select": _selection(indices, len(windows)), "attention": {"window": window}})
    return overrides


def _selection(indices: list[int], n_layers: int) -> Any:
    """A readable selection: an index, a slice such as '0::2' or '1:5', else the list."""
    if len(indices) == 1:
        return indices[0]
    step = indices[1] - indices[0]
    suffix = f":{step}" if step != 1 else ""
    for text in (f"{indices[0]}:{suffix}" if suffix else f"{indices[0]}:", f"{indices[0]}:{indices[-1] + 1}{suffix}"):
        if list(range(n_layers))[slice(*[int(p) if p else None for p in text.split(":")])] == indices:
            return text
    return indices


def layer_types_from_config(cfg: ConfigReader, default: list[str]) -> list[str]:
    layer_types = cfg.get("layer_types", None) or default
    if len(layer_types) != cfg.get_layers("num_hidden_layers"):
        raise UserError(f"{cfg.family}: layer_types has {len(layer_types)} entries for {cfg.get('num_hidden_layers')} layers")
    bad = sorted({t for t in layer_types if t not in ("full_attention", "sliding_attention")})
    if bad:
        raise UserError(f"{cfg.family}: layer_types {bad} are not supported; supported: full_attention, sliding_attention")
    return list(layer_types)


def single_window(view: SpecView, family: str) -> int | None:
    """The one sliding window every windowed layer uses (None if no layer has one)."""
    windows = {w for w in view.per_layer("attention", "window") if w is not None}
    if len(windows) > 1:
        raise NotExpressible("model.layers[*].attention.window", f"several window sizes {sorted(windows)}; Hugging Face {family} has one sliding_window")
    return windows.pop() if windows else None


# -- Llama-style checkpoint names ---------------------------------------------------------------------


def llama_rules(*, attention: str = "model.layers.{i}.self_attn", mlp: str | None = "model.layers.{i}.mlp") -> list[Rule]:
    """Embedding, q/k/v/o (+ biases), gate/up/down (unless ``mlp`` is None), final norm and head of a Llama-style checkpoint."""
    rules: list[Rule] = [
        Copy("model.embed_tokens.weight", "embedding.weight"),
        Fused([f"{attention}.q_proj.weight", f"{attention}.k_proj.weight", f"{attention}.v_proj.weight"],
              "blocks.{i}.attention.qkv.weight", sizes=qkv_sizes),
        Fused([f"{attention}.q_proj.bias", f"{attention}.k_proj.bias", f"{attention}.v_proj.bias"],
              "blocks.{i}.attention.qkv.bias", sizes=qkv_sizes),
        Copy(f"{attention}.o_proj.weight", "blocks.{i}.attention.out.weight"),
        Copy(f"{attention}.o_proj.bias", "blocks.{i}.attention.out.bias"),
    ]
    if mlp is not None:
        rules += [
            Fused([f"{mlp}.gate_proj.weight", f"{mlp}.up_proj.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
            Fused([f"{mlp}.gate_proj.bias", f"{mlp}.up_proj.bias"], "blocks.{i}.ffn.gate_up.bias", sizes=halves),
            Copy(f"{mlp}.down_proj.weight", "blocks.{i}.ffn.down.weight"),
            Copy(f"{mlp}.down_proj.bias", "blocks.{i}.ffn.down.bias"),
        ]
    rules += [
        Copy("model.norm.weight", "final_norm.weight"),
        Copy("lm_head.weight", "lm_head.weight"),
    ]
    return rules


def prenorm_rules() -> list[Rule]:
    return [
        Copy("model.layers.{i}.input_layernorm.weight", "blocks.{i}.attention_norm.weight"),
        Copy("model.layers.{i}.post_attention_layernorm.weight", "blocks.{i}.ffn_norm.weight"),
    ]


def check_rotary_dim(cfg: ConfigReader, n_heads: int, positional: dict[str, Any]) -> None:
    """transformers rotates int(head_dim * partial_rotary_factor) channels; an odd count has no pairing."""
    head_dim = cfg.get("head_dim", None) or cfg.get_size("hidden_size") // n_heads
    rotary = int(head_dim * positional.get("fraction", 1.0))
    if rotary % 2:
        raise UserError(
            f"{cfg.family}: partial_rotary_factor {positional.get('fraction')} rotates {rotary} of {head_dim} channels "
            "per head; an odd number cannot be split into rotation pairs"
        )


def no_output_bias(view: SpecView, family: str) -> None:
    """Families without an LM head bias or a separate final norm setting."""
    if view.model.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", f"Hugging Face {family} has no LM head bias")


__all__ = [
    "GATED_FFNS",
    "attention_sizes",
    "check_rotary_dim",
    "default_gated_hidden",
    "attention_sizes_config",
    "gated_ffn",
    "gated_ffn_config",
    "layer_types_from_config",
    "llama_rules",
    "model_sizes",
    "model_sizes_config",
    "no_output_bias",
    "prenorm_rules",
    "rmsnorm",
    "rmsnorm_config",
    "rope",
    "rope_config",
    "single_window",
    "window_layers",
]
