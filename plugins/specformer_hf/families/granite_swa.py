"""Granite SWA (``model_type: granite_swa``, ibm-granite/granite-swash-2b): Granite 3 with sliding windows, sinks and a
rope base per layer.

Granite 3's decoder (:data:`specformer_hf.families.granite.GRANITE_PARTS`: Llama's blocks with the muP
multipliers) where ``layer_types`` picks the sliding-window layers (default: every fourth layer from 0
full, the rest sliding), every attention layer has learned per-head sink logits (gpt-oss's: transformers
scales the output by ``sigmoid(logsumexp(scores) - sink)``, the same as one more logit in the softmax), and
``layer_rope_theta`` gives each layer its own rope base (0: that layer has no positions).
"""

from __future__ import annotations

from specformer_hf.families.gpt_oss import Sinks
from specformer_hf.families.granite import GRANITE_PARTS
from specformer_hf.parts.decoder import decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.positions import LayerRopeThetas, Rope
from specformer_hf.parts.windows import LayerTypes

#: transformers' GraniteSWAConfig defaults (granite-swash-2b's sizes; GraniteConfig's for the rest).
DEFAULTS = {
    "vocab_size": 100352, "hidden_size": 2560, "intermediate_size": 8192, "num_hidden_layers": 24,
    "num_attention_heads": 20, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0,
    "sliding_window": 128, "layer_types": None, "layer_rope_theta": None,
}

#: Granite SWA's decoder less its feed-forward (granitemoe_swa puts experts there).
GRANITE_SWA_PARTS = (*replace_part(GRANITE_PARTS, LayerRopeThetas(), instead_of=Rope), Sinks(),
                     # layer_types' default: layers 0, 4, 8, ... full, the others sliding.
                     LayerTypes(sliding=lambda i: i % 4 != 0))

FAMILY = decoder_family(
    name="Granite SWA",
    model_type="granite_swa",
    architecture="GraniteSWAForCausalLM",
    defaults=DEFAULTS,
    parts=[*GRANITE_SWA_PARTS, GatedFFN(bias_key="mlp_bias")],
    maps="as granite, with attention sinks, layer_types (default: every fourth layer from 0 full) + sliding_window -> "
         "per-layer windows, layer_rope_theta -> a rope base per layer (0: positional none)",
    caveats="one sliding_window for every sliding layer; per-layer ropes differ in their theta only",
)
