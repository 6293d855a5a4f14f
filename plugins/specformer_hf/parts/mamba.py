"""The Mamba-1 mixer: its config fields <-> the ``mamba`` component, and its tensors.

Mamba (``mamba``) and Falcon-Mamba (``falcon_mamba``) hold the same mixer under the same config
names; Falcon-Mamba adds weightless RMSNorms on the step, B and C (``mixer_rms_eps``), Jamba
weighted ones under its own ``mamba_*`` names (:class:`JambaMambaFields`).
:class:`MambaFields` is the one place a ``mamba`` spec is written from a config
(:meth:`~MambaFields.spec`) and written back (:meth:`~MambaFields.config`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_layers import default_dt_rank  # the rank a spec's dt_rank: null builds

from specformer_hf.config import ConfigReader
from specformer_hf.rules import Copy, DepthwiseConv, Rule
from specformer_hf.specview import NotExpressible

#: What transformers' ``time_step_rank`` says for ``ceil(hidden_size / 16)``; the spec's ``dt_rank: null``.
AUTO_RANK = "auto"


@dataclass(frozen=True)
class MambaFields:
    """Mamba's config fields <-> the ``mamba`` component; ``rms_eps``: the config field of the B, C, dt norms' eps."""

    rms_eps: str | None = None

    def spec(self, cfg: ConfigReader) -> dict[str, Any]:
        """The mixer's spec (the ``mixer:`` of every layer)."""
        cfg.require("hidden_act", ("silu",), why="Mamba's convolution is followed by SiLU")
        hidden = cfg.get_size("hidden_size")
        # transformers sizes the mixer by intermediate_size where config.json has one (it overrides expand).
        if cfg.get("intermediate_size", None) is not None:
            cfg.mark_read("expand")
            inner = cfg.get_size("intermediate_size")
        else:
            expand = cfg.get("expand")
            if isinstance(expand, bool) or not isinstance(expand, (int, float)) or expand <= 0:
                raise UserError(f"{cfg.family}: expand must be a positive number, got {expand!r}")
            inner = int(expand * hidden)
        rank = cfg.get("time_step_rank")
        mixer: dict[str, Any] = {
            "kind": "mamba", "d_inner": inner, "state_size": cfg.get_size("state_size"),
            "conv_kernel": cfg.get_size("conv_kernel"), "conv_bias": bool(cfg.get("use_conv_bias")),
            "bias": bool(cfg.get("use_bias")),
        }
        # transformers saves "auto" resolved (ceil(hidden_size / 16)): that rank is the spec's default, left unwritten.
        if rank != AUTO_RANK and cfg.get_size("time_step_rank") != default_dt_rank(hidden):
            mixer["dt_rank"] = cfg.get_size("time_step_rank")
        if self.rms_eps is not None:
            mixer["bcdt_norm_eps"] = cfg.get_float(self.rms_eps)
        return mixer

    def config(self, mixer: dict[str, Any], *, d_model: int, family: str) -> dict[str, Any]:
        """The config fields of one (resolved) ``mamba`` spec."""
        eps = mixer["bcdt_norm_eps"]
        if mixer.get("bcdt_norm_weights"):
            raise NotExpressible("model.block.mixer.bcdt_norm_weights",
                                 f"Hugging Face {family}'s norms on the step, B and C have no weights (Jamba's have)")
        if self.rms_eps is None and eps is not None:
            raise NotExpressible("model.block.mixer.bcdt_norm_eps",
                                 f"Hugging Face {family} has no norms on the step, B and C (Falcon-Mamba has)")
        if self.rms_eps is not None and eps is None:
            raise NotExpressible("model.block.mixer.bcdt_norm_eps",
                                 f"Hugging Face {family} always normalises the step, B and C (mixer_rms_eps)")
        inner = mixer["d_inner"]
        out: dict[str, Any] = {
            # intermediate_size is what transformers sizes the mixer by; expand (an int) is written as near as it goes.
            "intermediate_size": inner, "expand": max(1, round(inner / d_model)),
            "state_size": mixer["state_size"], "conv_kernel": mixer["conv_kernel"],
            "use_conv_bias": mixer["conv_bias"], "use_bias": mixer["bias"], "hidden_act": "silu",
            "time_step_rank": AUTO_RANK if mixer["dt_rank"] is None else mixer["dt_rank"],
        }
        if self.rms_eps is not None:
            out[self.rms_eps] = eps
        return out


@dataclass(frozen=True)
class JambaMambaFields:
    """Jamba's ``mamba_*`` config fields <-> a ``mamba`` mixer with weighted norms on dt, B and C (eps ``rms_norm_eps``).

    Jamba sizes the mixer by ``mamba_expand * hidden_size`` (an integer expand, no intermediate size of its own).
    """

    def spec(self, cfg: ConfigReader) -> dict[str, Any]:
        cfg.require("hidden_act", ("silu",), why="Jamba's Mamba convolution is followed by SiLU")
        hidden = cfg.get_size("hidden_size")
        mixer: dict[str, Any] = {
            "kind": "mamba", "d_inner": cfg.get_size("mamba_expand") * hidden, "state_size": cfg.get_size("mamba_d_state"),
            "conv_kernel": cfg.get_size("mamba_d_conv"), "conv_bias": bool(cfg.get("mamba_conv_bias")),
            "bias": bool(cfg.get("mamba_proj_bias")), "bcdt_norm_eps": cfg.get_float("rms_norm_eps"),
            "bcdt_norm_weights": True,
        }
        rank = cfg.get("mamba_dt_rank")
        if rank != AUTO_RANK and cfg.get_size("mamba_dt_rank") != default_dt_rank(hidden):
            mixer["dt_rank"] = cfg.get_size("mamba_dt_rank")
        return mixer

    def config(self, mixer: dict[str, Any], *, d_model: int, norm_eps: float, family: str) -> dict[str, Any]:
        """The config fields of one (resolved) ``mamba`` spec; ``norm_eps``: the block norms' eps (rms_norm_eps)."""
        if not mixer.get("bcdt_norm_weights") or mixer["bcdt_norm_eps"] != norm_eps:
            raise NotExpressible("model.block.mixer.bcdt_norm_weights", f"Hugging Face {family}'s Mamba layers "
                                 f"normalise the step, B and C with weights and rms_norm_eps, the block norms' eps "
                                 f"({norm_eps}): bcdt_norm_weights true and bcdt_norm_eps {norm_eps}")
        inner = mixer["d_inner"]
        if inner % d_model:
            raise NotExpressible("model.block.mixer.d_inner", f"Hugging Face {family} sizes the Mamba layers by "
                                 f"mamba_expand x d_model; {inner} is no multiple of {d_model}")
        return {"mamba_expand": inner // d_model, "mamba_d_state": mixer["state_size"],
                "mamba_d_conv": mixer["conv_kernel"], "mamba_conv_bias": mixer["conv_bias"],
                "mamba_proj_bias": mixer["bias"], "hidden_act": "silu",
                "mamba_dt_rank": AUTO_RANK if mixer["dt_rank"] is None else mixer["dt_rank"]}


def mamba_rules(hf: str, ours: str) -> list[Rule]:
    """transformers' Mamba layer at ``hf`` (``backbone.layers.{i}.mixer``) <-> our ``mamba`` mixer at ``ours``."""
    return [
        Copy(f"{hf}.in_proj.weight", f"{ours}.in_proj.weight"),
        Copy(f"{hf}.in_proj.bias", f"{ours}.in_proj.bias"),
        DepthwiseConv(f"{hf}.conv1d.weight", f"{ours}.conv_weight"),
        Copy(f"{hf}.conv1d.bias", f"{ours}.conv_bias"),
        Copy(f"{hf}.out_proj.weight", f"{ours}.out.weight"),
        Copy(f"{hf}.out_proj.bias", f"{ours}.out.bias"),
        *(Copy(f"{hf}.{name}", f"{ours}.{name}")
          for name in ("x_proj.weight", "dt_proj.weight", "dt_proj.bias", "A_log", "D")),
        # Jamba's weighted norms on dt, B and C (a rule whose parameter a mixer lacks is skipped there).
        *(Copy(f"{hf}.{norm}_layernorm.weight", f"{ours}.{norm}_norm_weight") for norm in ("dt", "b", "c")),
    ]


__all__ = ["AUTO_RANK", "JambaMambaFields", "MambaFields", "mamba_rules"]
