"""What the attention + Mamba-2 hybrid families share (Granite 4.0-H, Falcon-H1): the Mamba-2 mixer both ways,
its weight rules, and config multipliers that must read back bit for bit."""

from __future__ import annotations

import math
from typing import Any, Callable

from specformer.errors import UserError
from specformer.model.attention import cache_slots_of
from specformer.model.state import state_slots_of

from specformer_hf.config import ConfigReader
from specformer_hf.rules import Copy, DepthwiseConv, Rule
from specformer_hf.specview import NotExpressible


def exact_preimage(target: float, forward: Callable[[float], float], guess: float) -> float:
    """A config value ``v`` near ``guess`` with ``forward(v) == target`` exactly; ``guess`` when there is none.

    A spec value computed from a config value (``logit_scale = 1 / logits_scaling``) must
    come back unchanged after export and import. Division does not always invert a
    division in floating point, so the neighbours of ``guess`` are tried too, a few units
    in the last place either side. A spec value that was itself read from a config always
    has one; a value written by hand may fall between two that the formula reaches, and
    then comes back within a unit in the last place (the export's read-back allows that).
    """
    candidates = [guess]
    below = above = guess
    for _ in range(8):
        below, above = math.nextafter(below, -math.inf), math.nextafter(above, math.inf)
        candidates += [below, above]
    return next((value for value in candidates if forward(value) == target), guess)


# -- Mamba-2 ------------------------------------------------------------------------------------


def mamba2_mixer(cfg: ConfigReader, *, d_inner: int, proj_bias_key: str = "mamba_proj_bias") -> dict[str, Any]:
    """The ``mamba2`` mixer of a Mamba-2 hybrid config (the ``mamba_*`` fields, time_step_limit, rms_norm_eps)."""
    heads = cfg.get_size("mamba_n_heads")
    head_dim = cfg.get("mamba_d_head")
    if head_dim in (None, "auto"):
        head_dim = d_inner // heads
    if heads * head_dim != d_inner:
        raise UserError(f"{cfg.family}: mamba_n_heads ({heads}) x mamba_d_head ({head_dim}) must be the Mamba inner "
                        f"width ({d_inner})")
    low, high = dt_limits(cfg)
    mixer: dict[str, Any] = {
        "kind": "mamba2", "n_heads": heads, "head_dim": int(head_dim), "state_size": cfg.get_size("mamba_d_state"),
        "n_groups": cfg.get_size("mamba_n_groups"), "conv_kernel": cfg.get_size("mamba_d_conv"),
        "conv_bias": bool(cfg.get("mamba_conv_bias")), "bias": bool(cfg.get(proj_bias_key)),
        "dt_min": low, "dt_max": high, "norm_eps": cfg.get_float("rms_norm_eps"),
        "chunk": cfg.get_size("mamba_chunk_size"),
    }
    return mixer


def dt_limits(cfg: ConfigReader) -> tuple[float, float | None]:
    """time_step_limit ``(low, high)`` as the mixer's ``dt_min`` and ``dt_max`` (None: no upper limit)."""
    limit = cfg.get("time_step_limit")
    if limit is None:
        return 0.0, None
    if not isinstance(limit, (list, tuple)) or len(limit) != 2:
        raise UserError(f"{cfg.family}: time_step_limit must be [low, high], got {limit!r}")
    low, high = (json_float(v, cfg.family) for v in limit)
    return low, None if math.isinf(high) else high


#: How transformers 5 writes a float JSON has no number for (``{"__float__": "Infinity"}``).
FLOAT_TAG = "__float__"


def json_float(value: Any, family: str) -> float:
    """A config float, as a number or in transformers' tagged form for infinities."""
    if isinstance(value, dict) and set(value) == {FLOAT_TAG}:
        value = value[FLOAT_TAG]
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UserError(f"{family}: time_step_limit holds {value!r}, not a number")
    try:
        return float(value)
    except ValueError:
        raise UserError(f"{family}: time_step_limit holds {value!r}, not a number") from None


def mamba2_config(mixer: dict[str, Any]) -> dict[str, Any]:
    """The ``mamba_*`` fields of one ``mamba2`` mixer (full params); the caller checks widths and eps."""
    high = mixer["dt_max"]
    return {
        "mamba_n_heads": mixer["n_heads"], "mamba_d_head": mixer["head_dim"], "mamba_d_state": mixer["state_size"],
        "mamba_n_groups": mixer["n_groups"], "mamba_d_conv": mixer["conv_kernel"],
        "mamba_conv_bias": mixer["conv_bias"], "mamba_chunk_size": mixer["chunk"],
        # transformers writes an infinite limit in its tagged form, and reads it back so.
        "time_step_limit": [mixer["dt_min"], {FLOAT_TAG: "Infinity"} if high is None else high],
    }


def uniform_mixers(mixers: list[dict[str, Any]], *, family: str, what: str) -> dict[str, Any]:
    """The one setting every layer's ``what`` mixer has (a Hugging Face config holds one)."""
    first = mixers[0]
    for other in mixers[1:]:
        if other != first:
            raise NotExpressible("model.layers[*].attention", f"the {what} layers differ; Hugging Face {family} "
                                 f"has one {what} setting for all of them")
    return first


def keeps_state(mixer: Any) -> bool:
    """A recurrent mixer (Mamba-2): it declares a state per sequence."""
    return state_slots_of(mixer) is not None


def keeps_keys(mixer: Any) -> bool:
    """Softmax attention: it keeps keys per token."""
    return cache_slots_of(mixer) is not None


def mamba2_rules(hf: str, ours: str) -> list[Rule]:
    """transformers' Mamba-2 layer at ``hf`` (``model.layers.{i}.mamba``) <-> our ``mamba2`` mixer at ``ours``."""
    rules: list[Rule] = [
        Copy(f"{hf}.in_proj.weight", f"{ours}.in_proj.weight"),
        Copy(f"{hf}.in_proj.bias", f"{ours}.in_proj.bias"),
        DepthwiseConv(f"{hf}.conv1d.weight", f"{ours}.conv_weight"),
        Copy(f"{hf}.conv1d.bias", f"{ours}.conv_bias"),
        Copy(f"{hf}.out_proj.weight", f"{ours}.out.weight"),
        Copy(f"{hf}.out_proj.bias", f"{ours}.out.bias"),
    ]
    rules += [Copy(f"{hf}.{name}", f"{ours}.{name}") for name in ("dt_bias", "A_log", "D", "norm.weight")]
    return rules


def embedding_multiplier_config(model: Any) -> float:
    """The model's ``embedding_multiplier`` as the number a config holds (``sqrt_d_model`` worked out)."""
    if model.embedding_multiplier == "sqrt_d_model":
        return model.d_model ** 0.5
    return float(model.embedding_multiplier)


__all__ = ["dt_limits", "embedding_multiplier_config", "exact_preimage", "json_float",
           "keeps_keys", "keeps_state", "mamba2_config", "mamba2_mixer", "mamba2_rules", "uniform_mixers"]
