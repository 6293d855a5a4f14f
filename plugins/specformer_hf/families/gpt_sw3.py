"""GPT-SW3 (``model_type: gpt-sw3``): transformers maps the model type to GPT2Config and GPT2LMHeadModel, so a
config.json saying ``gpt-sw3`` is GPT-2 in every field and tensor."""

from __future__ import annotations

from dataclasses import replace

from specformer_hf.families import gpt2

FAMILY = replace(
    gpt2.FAMILY,
    name="GPT-SW3",
    model_type="gpt-sw3",
    maps="as GPT-2 (transformers builds GPT2LMHeadModel from GPT2Config): learned positions, LayerNorm, fused c_attn, "
         "GELU MLP, the per-layer attention scales",
    caveats="as GPT-2; export writes model_type gpt-sw3, which transformers loads as GPT-2",
)
