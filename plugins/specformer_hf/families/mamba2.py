"""Mamba-2 (``model_type: mamba2``, Mamba-Codestral-7B): a stack of pre-normed Mamba-2 mixers and nothing else.

Each layer is ``x + mixer(rmsnorm(x))``: in the spec, a ``prenorm`` block whose mixer is
``mamba2`` and whose ffn is ``none`` (no feed-forward, and no norm for it). There are no
positions. The mixer's config fields and tensors are :class:`~specformer_hf.parts.mamba2.Mamba2Fields`' defaults,
which Nemotron-H and the attention + Mamba-2 hybrids share under other config names.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import BLOCK_MIXER, FamilyView, Part
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.mamba2 import Mamba2Fields, mamba2_rules
from specformer_hf.parts.positions import no_positions
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


def context_length(cfg: ConfigReader) -> int:
    """max_position_embeddings where the config has one (specformer writes it), else :data:`DEFAULT_CONTEXT`."""
    value = cfg.get("max_position_embeddings", None)
    return DEFAULT_CONTEXT if value is None else cfg.get_size("max_position_embeddings")


@dataclass(frozen=True)
class Mamba2Model(Part):
    """The whole model: sizes, pre-norm RMSNorm blocks of a Mamba-2 mixer and no ffn, no positions.

    Mamba-1's families are the same stack around another mixer: a subclass names its ``mixer``
    fields, its component ``kind`` and its tensors' ``mixer_rules``.
    """

    mixer: Mamba2Fields = Mamba2Fields()
    kind: ClassVar[str] = "mamba2"
    mixer_rules: ClassVar[Callable[[str, str], list[Rule]]] = staticmethod(mamba2_rules)

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.update(
            vocab_size=cfg.get_int("vocab_size"), d_model=cfg.get_size("hidden_size"),
            n_layers=cfg.get_layers("num_hidden_layers"), context_length=context_length(cfg),
            tie_embeddings=bool(cfg.get("tie_word_embeddings")), positional={"kind": "none"},
            block={"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": cfg.get_float("layer_norm_epsilon")},
                   "mixer": self.mixer.spec(cfg), "ffn": "none"},
        )

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m = view.model
        if m.lm_head_bias:
            raise NotExpressible("model.lm_head_bias", f"Hugging Face {view.name} has no LM head bias")
        no_positions(view)
        view.block_kind("layout", ("prenorm",))
        view.block_kind("norm", ("rmsnorm",))
        view.block_kind("mixer", (self.kind,))
        view.block_kind("ffn", ("none",))
        config.update(vocab_size=m.vocab_size, hidden_size=m.d_model, num_hidden_layers=m.n_layers,
                      max_position_embeddings=m.context_length, tie_word_embeddings=m.tie_embeddings,
                      layer_norm_epsilon=view.uniform("norm", "eps"))
        config.update(self.mixer.config(view.uniform("mixer"), d_model=m.d_model, family=view.name))

    def rules(self) -> list[Rule]:
        return [
            Copy("backbone.embeddings.weight", "embedding.weight"),
            Copy("backbone.norm_f.weight", "final_norm.weight"),
            Copy("lm_head.weight", "lm_head.weight"),
            Copy(f"{LAYER}.norm.weight", "blocks.{i}.attention_norm.weight"),
            *self.mixer_rules(f"{LAYER}.mixer", BLOCK_MIXER),
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
