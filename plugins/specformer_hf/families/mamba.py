"""Mamba (``model_type: mamba``, state-spaces/mamba-*-hf): a stack of pre-normed Mamba-1 mixers and nothing else.

Each layer is ``x + mixer(rmsnorm(x))``: in the spec, a ``prenorm`` block whose mixer is ``mamba``
and whose ffn is ``none``, no positions -- Mamba-2's stack (:class:`~specformer_hf.families.mamba2.Mamba2Model`)
around the Mamba-1 mixer (:class:`~specformer_hf.parts.mamba.MambaFields`), whose tensors are
``backbone.layers.{i}.mixer.*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from specformer_hf.families.mamba2 import DEFAULT_CONTEXT, Mamba2Model
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.mamba import MambaFields, mamba_rules

#: transformers' MambaConfig defaults.
DEFAULTS = {
    "vocab_size": 50280, "hidden_size": 768, "state_size": 16, "num_hidden_layers": 32, "layer_norm_epsilon": 1e-5,
    "expand": 2, "conv_kernel": 4, "use_bias": False, "use_conv_bias": True, "hidden_act": "silu",
    "residual_in_fp32": True, "time_step_rank": "auto", "tie_word_embeddings": True,
}
#: Fields that only initialise the weights or choose transformers' algorithm, and residual_in_fp32 (see caveats).
NON_MATH_FIELDS = ("time_step_scale", "time_step_min", "time_step_max", "time_step_init_scheme", "time_step_floor",
                   "rescale_prenorm_residual", "residual_in_fp32", "use_mambapy", "use_associative_scan")
CAVEATS = (f"context_length is {DEFAULT_CONTEXT} when config.json has no max_position_embeddings (Mamba has no "
           "limit); residual_in_fp32 is not reproduced (the residual stream is in the model's dtype)")


@dataclass(frozen=True)
class MambaModel(Mamba2Model):
    """Mamba-2's stack of pre-normed mixers, with Mamba-1's mixer (``rms_eps``: Falcon-Mamba's norms)."""

    mixer: MambaFields = MambaFields()  # type: ignore[assignment]  # the same spec() and config() as Mamba2Fields
    kind: ClassVar[str] = "mamba"
    mixer_rules = staticmethod(mamba_rules)


FAMILY = decoder_family(
    name="Mamba",
    model_type="mamba",
    architecture="MambaForCausalLM",
    defaults=DEFAULTS,
    parts=[MambaModel()],
    non_math_fields=NON_MATH_FIELDS,
    maps="blocks of mamba (intermediate_size or expand * hidden_size -> d_inner, state_size, time_step_rank -> "
         "dt_rank, conv_kernel, use_conv_bias, use_bias) with ffn none, pre-norm RMSNorm (layer_norm_epsilon), "
         "positional none; max_position_embeddings (written by specformer) -> context_length",
    caveats=CAVEATS,
)
