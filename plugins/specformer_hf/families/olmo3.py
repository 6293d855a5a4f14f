"""OLMo 3 (``model_type: olmo3``, Olmo-3-7B / 32B): OLMo-2's blocks (norms after each sublayer inside the residual,
q/k RMSNorm over all heads) with three sliding-window layers to one global layer, each kind with its own rope."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.norms import Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.windows import LayerTypeRopes

#: transformers' Olmo3Config defaults (theta 500k for both layer types).
DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False, "sliding_window": 4096,
    "layer_types": None,
}
THETA = {"sliding_attention": 500_000.0, "full_attention": 500_000.0}

FAMILY = decoder_family(
    name="OLMo 3",
    model_type="olmo3",
    architecture="Olmo3ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(LLAMA_PARTS, Layout("postnorm_inside")),
                      LayerTypeRopes(pattern=4, theta=THETA, pattern_key=None, flat_is_full=False), instead_of=Rope),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("all"),
    ],
    maps="as OLMo-2 (layout postnorm_inside, q/k RMSNorm over all heads, attention_bias) with layer_types (default: "
         "every 4th layer global) and sliding_window -> per-layer windows, and rope_parameters per layer type (or "
         "rope_theta + rope_scaling for the global layers) -> per-layer positional",
    caveats="in the legacy form (rope_theta, rope_scaling) the sliding layers' rope is the default one at theta 500k, "
            "as transformers 5 reads it; a flat rope_parameters without layer types is refused (transformers ignores it)",
)
