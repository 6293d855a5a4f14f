"""Granite MoE with a shared expert (``model_type: granitemoeshared``): granitemoe plus an always-on SwiGLU expert.

As :mod:`specformer_hf.families.granitemoe`, with one shared expert of width
``shared_intermediate_size`` added to the mixture's output in every layer (``shared_mlp``, its
gate and up projections fused as ours); a width of 0 (transformers' default) is no shared expert.
"""

from __future__ import annotations

from specformer_hf.families.granite import GRANITE_PARTS
from specformer_hf.families.granitemoe import DEFAULTS as MOE_DEFAULTS
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.feedforward import GraniteExperts

#: transformers' GraniteMoeSharedConfig defaults: GraniteMoeConfig's and shared_intermediate_size.
DEFAULTS = {**MOE_DEFAULTS, "shared_intermediate_size": 0}

FAMILY = decoder_family(
    name="Granite MoE (shared expert)",
    model_type="granitemoeshared",
    architecture="GraniteMoeSharedForCausalLM",
    defaults=DEFAULTS,
    parts=[*GRANITE_PARTS, GraniteExperts(shared="optional")],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="as granitemoe, with shared_intermediate_size -> one ungated-sum shared SwiGLU expert (0: none)",
    caveats="experts in every layer, no biases on them; reads fused or checkpoint-named expert tensors, writes them as "
            "save_pretrained does",
)
