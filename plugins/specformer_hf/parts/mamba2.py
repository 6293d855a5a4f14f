"""The Mamba-2 mixer: its config fields <-> the ``mamba2`` component, and its tensors.

Mamba-2 (``mamba2``), Nemotron-H and the attention + Mamba-2 hybrids (Granite 4.0-H, Falcon-H1)
hold the same mixer under different config names. :class:`Mamba2Fields` states one family's
names and how it sizes and limits the mixer; its :meth:`~Mamba2Fields.spec` is the one place a
``mamba2`` spec is written from a config, and :meth:`~Mamba2Fields.config` the one place it is
written back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.rules import Copy, DepthwiseConv, Rule
from specformer_hf.specview import NotExpressible

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


def dt_limits(cfg: ConfigReader) -> tuple[float, float | None]:
    """time_step_limit ``(low, high)`` as the mixer's ``dt_min`` and ``dt_max`` (None: no upper limit)."""
    limit = cfg.get("time_step_limit")
    if limit is None:
        return 0.0, None
    if not isinstance(limit, (list, tuple)) or len(limit) != 2:
        raise UserError(f"{cfg.family}: time_step_limit must be [low, high], got {limit!r}")
    low, high = (json_float(v, cfg.family) for v in limit)
    return low, None if math.isinf(high) else high


@dataclass(frozen=True)
class Mamba2Fields:
    """One family's config fields of a Mamba-2 mixer <-> the ``mamba2`` component (the defaults: Mamba-2's names).

    ``width``: how the inner width ``n_heads * head_dim`` is sized -- ``"expand"``: the config's
    ``expand * hidden_size`` must equal it (Mamba-2 sizes its projections by it); ``"heads"``: by the
    heads alone, ``expand`` read and ignored (Nemotron-H); ``"given"``: the caller's ``d_inner``, and
    a ``head_dim`` of null or ``"auto"`` is ``d_inner / heads`` (the hybrids, whose caller checks
    the width on export). ``step``: ``"limit"``: the step is clamped to ``time_step_limit``
    ``[min, max]`` (Mamba-2); ``"optional_limit"``: the same, null meaning no clamp, an infinite
    max written in transformers' tagged form (the hybrids); ``"min"``: clamped from below at
    ``time_step_min`` (Nemotron-H). ``act``: the field that must say SiLU (None: the family has
    none). ``norm_before_gate``: whether the family's config can say so (Falcon-H1 writes it
    itself; Mamba-2 and Nemotron-H refuse it). The norm's eps (``eps``) is read here and written
    by the caller, which knows whether the block norms share it.
    """

    heads: str = "num_heads"
    head_dim: str = "head_dim"
    state: str = "state_size"
    groups: str = "n_groups"
    conv: str = "conv_kernel"
    conv_bias: str = "use_conv_bias"
    bias: str = "use_bias"
    eps: str = "layer_norm_epsilon"
    chunk: str = "chunk_size"
    act: str | None = "hidden_act"
    width: Literal["expand", "heads", "given"] = "expand"
    step: Literal["limit", "optional_limit", "min"] = "limit"
    norm_before_gate: bool = False

    def spec(self, cfg: ConfigReader, *, d_inner: int | None = None) -> dict[str, Any]:
        """The mixer's spec (the ``mixer:`` of a Mamba layer); ``d_inner`` with ``width="given"``."""
        if self.act:
            cfg.require(self.act, ("silu",), why="Mamba-2's convolution is followed by SiLU")
        heads = cfg.get_size(self.heads)
        if self.width == "given":
            assert d_inner is not None, "width='given' needs the caller's d_inner"
            head_dim = cfg.get(self.head_dim)
            if head_dim in (None, "auto"):
                head_dim = d_inner // heads
            if heads * head_dim != d_inner:
                raise UserError(f"{cfg.family}: {self.heads} ({heads}) x {self.head_dim} ({head_dim}) must be the Mamba "
                                f"inner width ({d_inner})")
        else:
            head_dim = cfg.get_size(self.head_dim)
        if self.width == "expand":
            hidden, expand = cfg.get_size("hidden_size"), cfg.get("expand")
            if not isinstance(expand, (int, float)) or int(expand * hidden) != heads * head_dim:
                raise UserError(f"{cfg.family}: expand * hidden_size ({expand} * {hidden}) must equal {self.heads} * "
                                f"{self.head_dim} ({heads} * {head_dim}): transformers sizes the projections by the first "
                                "and the heads by the second")
        elif self.width == "heads":
            cfg.mark_read("expand")  # transformers' Nemotron-H sizes its mixer by the heads alone
        mixer: dict[str, Any] = {
            "kind": "mamba2", "n_heads": heads, "head_dim": int(head_dim), "state_size": cfg.get_size(self.state),
            "n_groups": cfg.get_size(self.groups), "conv_kernel": cfg.get_size(self.conv),
            "conv_bias": bool(cfg.get(self.conv_bias)), "bias": bool(cfg.get(self.bias)),
            "norm_eps": cfg.get_float(self.eps), "chunk": cfg.get_size(self.chunk),
        }
        if self.step == "limit":
            limit = cfg.get("time_step_limit")
            if not isinstance(limit, (list, tuple)) or len(limit) != 2:
                raise UserError(f"{cfg.family}: time_step_limit must be [min, max], got {limit!r}")
            low, high = json_float(limit[0], cfg.family), json_float(limit[1], cfg.family)
            mixer.update(dt_min=low, dt_max=None if math.isinf(high) else high)
        elif self.step == "optional_limit":
            low, optional_high = dt_limits(cfg)
            mixer.update(dt_min=low, dt_max=optional_high)
        else:
            cfg.mark_read("time_step_limit")  # transformers' Nemotron-H clamps at time_step_min and ignores it
            mixer["dt_min"] = cfg.get_float("time_step_min")
        return mixer

    def config(self, mixer: dict[str, Any], *, d_model: int, family: str) -> dict[str, Any]:
        """The config fields of one (resolved) ``mamba2`` spec, but the norm's eps."""
        if mixer["norm_before_gate"] and not self.norm_before_gate:
            raise NotExpressible("model.block.mixer.norm_before_gate",
                                 f"Hugging Face {family} gates before its norm (norm_before_gate: false)")
        heads, head_dim = mixer["n_heads"], mixer["head_dim"]
        out: dict[str, Any] = {
            self.heads: heads, self.head_dim: head_dim, self.state: mixer["state_size"], self.groups: mixer["n_groups"],
            self.conv: mixer["conv_kernel"], self.conv_bias: mixer["conv_bias"], self.bias: mixer["bias"],
            self.chunk: mixer["chunk"],
        }
        if self.act:
            out[self.act] = "silu"
        if self.width == "expand":
            if (heads * head_dim) % d_model:
                raise NotExpressible("model.block.mixer", f"Hugging Face {family}'s inner width is an integer "
                                     f"expand * hidden_size; n_heads * head_dim ({heads * head_dim}) is not a multiple "
                                     f"of d_model ({d_model})")
            out["expand"] = heads * head_dim // d_model
        high = mixer["dt_max"]
        if self.step == "limit":
            out["time_step_limit"] = [mixer["dt_min"], math.inf if high is None else high]
        elif self.step == "optional_limit":
            # transformers writes an infinite limit in its tagged form, and reads it back so.
            out["time_step_limit"] = [mixer["dt_min"], {FLOAT_TAG: "Infinity"} if high is None else high]
        else:
            if high is not None:
                raise NotExpressible("model.block.mixer.dt_max", f"Hugging Face {family} has no upper clamp of the step")
            out["time_step_min"] = mixer["dt_min"]
        return out


#: The attention + Mamba-2 hybrids' ``mamba_*`` fields (Granite 4.0-H, Falcon-H1); the caller gives the inner width.
HYBRID_FIELDS = Mamba2Fields(
    heads="mamba_n_heads", head_dim="mamba_d_head", state="mamba_d_state", groups="mamba_n_groups", conv="mamba_d_conv",
    conv_bias="mamba_conv_bias", bias="mamba_proj_bias", eps="rms_norm_eps", chunk="mamba_chunk_size", act=None,
    width="given", step="optional_limit", norm_before_gate=True,
)


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


__all__ = ["FLOAT_TAG", "HYBRID_FIELDS", "Mamba2Fields", "dt_limits", "json_float", "mamba2_rules"]
