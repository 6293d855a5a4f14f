"""Granite MoE SWA (``model_type: granitemoe_swa``, ibm-granite/granite-swash-3b-a600m): Granite SWA's attention over
Granite MoE's experts.

transformers builds it from GraniteMoeShared's layers (experts in every layer, an optional shared expert of
``shared_intermediate_size``, 0 by default: none) with Granite SWA's attention: learned per-head sinks,
``layer_types`` windows and ``layer_rope_theta`` (:data:`specformer_hf.families.granite_swa.GRANITE_SWA_PARTS`).
"""

from __future__ import annotations

from specformer_hf.families.granite_swa import GRANITE_SWA_PARTS
from specformer_hf.families.granitemoeshared import DEFAULTS as SHARED_DEFAULTS
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.feedforward import GraniteExperts

#: transformers' GraniteMoeSWAConfig defaults: GraniteMoeSharedConfig's (Llama-2-7B's sizes, 8 experts) and the windows.
DEFAULTS = {**SHARED_DEFAULTS, "sliding_window": 128, "layer_types": None, "layer_rope_theta": None}

FAMILY = decoder_family(
    name="Granite MoE SWA",
    model_type="granitemoe_swa",
    architecture="GraniteMoeSWAForCausalLM",
    defaults=DEFAULTS,
    # No conversion mapping in transformers for this model type: save_pretrained writes the fused expert names.
    parts=[*GRANITE_SWA_PARTS, GraniteExperts(shared="optional", checkpoint_names=False)],
    maps="as granite_swa's attention (sinks, layer_types windows, layer_rope_theta) over granitemoeshared's experts "
         "(shared_intermediate_size: one ungated-sum shared SwiGLU expert, 0: none)",
    caveats="as granite_swa and granitemoeshared: one sliding_window; experts in every layer, no biases on them; reads "
            "fused or checkpoint-named expert tensors, writes the fused ones as save_pretrained does",
)
