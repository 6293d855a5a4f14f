"""Mamba-2 (``model_type: mamba2``, Mamba-Codestral-7B): a stack of pre-normed Mamba-2 mixers and nothing else.

Each layer is ``x + mixer(rmsnorm(x))``: in the spec, a ``prenorm`` block whose mixer is
``mamba2`` and whose ffn is ``none`` (no feed-forward, and no norm for it). There are no
positions. :class:`Mamba2Mixer` (the mixer's config fields and tensors) is shared with
Nemotron-H, whose Mamba layers are the same module under other config names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_hf.config import ConfigReader
from specformer_hf.families.common import FamilyView, Part, decoder_family
from specformer_hf.families.hybrid import json_float, mamba2_rules
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible

#: transformers' Mamba2Config defaults.
DEFAULTS = {
    "vocab_size": 32768, "hidden_size": 4096, "state_size": 128, "num_hidden_layers": 64, "layer_norm_epsilon": 1e-5,
    "expand": 2, "conv_kernel": 4, "n_groups": 8, "use_bias": False, "use_conv_bias": True, "hidden_act": "silu",
    "num_heads": 128, "head_dim": 64, "residual_in_fp32": True, "time_step_limit": (0.0, math.inf),
    "chunk_size": 256, "tie_word_embeddings": False,
}
#: Mamba-2 has no context limit and its config no max_position_embeddings; the spec needs one.
DEFAULT_CONTEXT = 4096
LAYER = "backbone.layers.{i}"


@dataclass(frozen=True)
class Mamba2Mixer:
    """A Mamba-2 mixer's config fields <-> the ``mamba2`` component, and its tensors under ``{layer}.mixer``.

    The field names differ between families (``heads``, ``head_dim``, ``state``, ``act``);
    ``dt_limit``: the step is clamped to ``time_step_limit`` (Mamba-2), else from below at
    ``time_step_min`` (Nemotron-H); ``expand``: the config's ``expand * hidden_size`` must be
    the inner width ``heads * head_dim`` (Mamba-2 sizes its projections by it).
    """

    layer: str
    heads: str = "num_heads"
    head_dim: str = "head_dim"
    state: str = "state_size"
    act: str = "hidden_act"
    dt_limit: bool = True
    expand: bool = True

    def spec(self, cfg: ConfigReader) -> dict[str, Any]:
        """The mixer's spec (the ``attention:`` of a Mamba layer)."""
        cfg.require(self.act, ("silu",), why="Mamba-2's convolution is followed by SiLU")
        heads, head_dim = cfg.get_size(self.heads), cfg.get_size(self.head_dim)
        if self.expand:
            hidden, expand = cfg.get_size("hidden_size"), cfg.get("expand")
            if not isinstance(expand, (int, float)) or int(expand * hidden) != heads * head_dim:
                raise UserError(f"{cfg.family}: expand * hidden_size ({expand} * {hidden}) must equal {self.heads} * "
                                f"{self.head_dim} ({heads} * {head_dim}): transformers sizes the projections by the first "
                                "and the heads by the second")
        else:
            cfg.mark_read("expand")  # transformers' Nemotron-H sizes its mixer by the heads alone
        mixer: dict[str, Any] = {
            "kind": "mamba2", "n_heads": heads, "head_dim": head_dim, "state_size": cfg.get_size(self.state),
            "n_groups": cfg.get_size("n_groups"), "conv_kernel": cfg.get_size("conv_kernel"),
            "conv_bias": bool(cfg.get("use_conv_bias")), "bias": bool(cfg.get("use_bias")),
            "norm_eps": cfg.get_float("layer_norm_epsilon"), "chunk": cfg.get_size("chunk_size"),
        }
        if self.dt_limit:
            limit = cfg.get("time_step_limit")
            if not isinstance(limit, (list, tuple)) or len(limit) != 2:
                raise UserError(f"{cfg.family}: time_step_limit must be [min, max], got {limit!r}")
            low, high = json_float(limit[0], cfg.family), json_float(limit[1], cfg.family)
            mixer.update(dt_min=low, dt_max=None if math.isinf(high) else high)
        else:
            cfg.mark_read("time_step_limit")  # transformers' Nemotron-H clamps at time_step_min and ignores it
            mixer["dt_min"] = cfg.get_float("time_step_min")
        return mixer

    def config(self, mixer: dict[str, Any], *, d_model: int, family: str) -> dict[str, Any]:
        """The config fields of one (resolved) ``mamba2`` spec."""
        if mixer["norm_before_gate"]:
            raise NotExpressible("model.block.attention.norm_before_gate",
                                 f"Hugging Face {family} gates before its norm (norm_before_gate: false)")
        heads, head_dim = mixer["n_heads"], mixer["head_dim"]
        out: dict[str, Any] = {
            self.heads: heads, self.head_dim: head_dim, self.state: mixer["state_size"], "n_groups": mixer["n_groups"],
            "conv_kernel": mixer["conv_kernel"], "use_conv_bias": mixer["conv_bias"], "use_bias": mixer["bias"],
            "chunk_size": mixer["chunk"], self.act: "silu",
        }
        if self.expand:
            if (heads * head_dim) % d_model:
                raise NotExpressible("model.block.attention", f"Hugging Face {family}'s inner width is an integer "
                                     f"expand * hidden_size; n_heads * head_dim ({heads * head_dim}) is not a multiple "
                                     f"of d_model ({d_model})")
            out["expand"] = heads * head_dim // d_model
        if self.dt_limit:
            out["time_step_limit"] = [mixer["dt_min"], math.inf if mixer["dt_max"] is None else mixer["dt_max"]]
        else:
            if mixer["dt_max"] is not None:
                raise NotExpressible("model.block.attention.dt_max", f"Hugging Face {family} has no upper clamp of the step")
            out["time_step_min"] = mixer["dt_min"]
        return out

    def rules(self) -> list[Rule]:
        return mamba2_rules(f"{self.layer}.mixer", "blocks.{i}.attention")


def no_positions(view: FamilyView) -> None:
    """Families whose layers read no positions: ``positional: none`` everywhere."""
    if view.positional["kind"] != "none" or any(p is not None and p["kind"] != "none" for p in view.per_layer("positional")):
        raise NotExpressible("model.positional.kind", f"Hugging Face {view.name} has no positions (positional: none)")


def context_length(cfg: ConfigReader) -> int:
    """max_position_embeddings where the config has one (specformer writes it), else :data:`DEFAULT_CONTEXT`."""
    value = cfg.get("max_position_embeddings", None)
    return DEFAULT_CONTEXT if value is None else cfg.get_size("max_position_embeddings")


@dataclass(frozen=True)
class Mamba2Model(Part):
    """The whole model: sizes, pre-norm RMSNorm blocks of a Mamba-2 mixer and no ffn, no positions."""

    mixer: Mamba2Mixer = Mamba2Mixer(LAYER)

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.update(
            vocab_size=cfg.get_int("vocab_size"), d_model=cfg.get_size("hidden_size"),
            n_layers=cfg.get_layers("num_hidden_layers"), context_length=context_length(cfg),
            tie_embeddings=bool(cfg.get("tie_word_embeddings")), positional={"kind": "none"},
            block={"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": cfg.get_float("layer_norm_epsilon")},
                   "attention": self.mixer.spec(cfg), "ffn": "none"},
        )

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m = view.model
        if m.lm_head_bias:
            raise NotExpressible("model.lm_head_bias", f"Hugging Face {view.name} has no LM head bias")
        no_positions(view)
        view.block_kind("layout", ("prenorm",))
        view.block_kind("norm", ("rmsnorm",))
        view.block_kind("attention", ("mamba2",))
        view.block_kind("ffn", ("none",))
        config.update(vocab_size=m.vocab_size, hidden_size=m.d_model, num_hidden_layers=m.n_layers,
                      max_position_embeddings=m.context_length, tie_word_embeddings=m.tie_embeddings,
                      layer_norm_epsilon=view.uniform("norm", "eps"))
        config.update(self.mixer.config(view.uniform("attention"), d_model=m.d_model, family=view.name))

    def rules(self) -> list[Rule]:
        return [
            Copy("backbone.embeddings.weight", "embedding.weight"),
            Copy("backbone.norm_f.weight", "final_norm.weight"),
            Copy("lm_head.weight", "lm_head.weight"),
            Copy(f"{LAYER}.norm.weight", "blocks.{i}.attention_norm.weight"),
            *self.mixer.rules(),
        ]


FAMILY = decoder_family(
    name="Mamba-2",
    model_type="mamba2",
    architecture="Mamba2ForCausalLM",
    defaults=DEFAULTS,
    parts=[Mamba2Model()],
    # Initialisation only (time_step_*, rescale_prenorm_residual) or unused by the model (time_step_rank);
    # residual_in_fp32 keeps the residual stream in float32 under half precision, which specformer does not.
    non_math_fields=("time_step_min", "time_step_max", "time_step_floor", "time_step_rank", "rescale_prenorm_residual",
                     "residual_in_fp32"),
    maps="blocks of mamba2 (num_heads, head_dim, state_size, n_groups, conv_kernel, use_conv_bias, use_bias, "
         "time_step_limit -> dt_min/dt_max, chunk_size) with ffn none, pre-norm RMSNorm (layer_norm_epsilon), "
         "positional none; max_position_embeddings (written by specformer) -> context_length",
    caveats=f"context_length is {DEFAULT_CONTEXT} when config.json has no max_position_embeddings (Mamba-2 has no "
            "limit); residual_in_fp32 is not reproduced (the residual stream is in the model's dtype)",
)
