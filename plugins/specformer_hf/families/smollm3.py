"""SmolLM3 (``model_type: smollm3``): Llama's blocks with every fourth layer (or those no_rope_layers names) without
positions (NoPE)."""

from __future__ import annotations

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.positions import NoRopeLayers, Rope, no_rope_flags
from specformer_hf.parts.windows import SwitchedWindows

#: transformers' SmolLM3Config defaults.
DEFAULTS = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "use_sliding_window": False, "sliding_window": None, "no_rope_layers": None,
    "no_rope_layer_interval": 4, "layer_types": None, "attention_bias": False, "mlp_bias": False,
    "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 2000000.0},
}


def nope_layers_slide(cfg: ConfigReader, n_layers: int) -> list[bool]:
    """SmolLM3Config without layer_types: the NoPE layers slide, when a sliding_window is set."""
    has_window = cfg.get("sliding_window") is not None
    return [has_window and not use_rope for use_rope in no_rope_flags(cfg, n_layers)]


FAMILY = decoder_family(
    name="SmolLM3",
    model_type="smollm3",
    architecture="SmolLM3ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, Rope(other_layers=("none",))),
        NoRopeLayers(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Switch("mlp_bias", ("ffn.bias",)),
        SwitchedWindows(nope_layers_slide),
    ],
    maps="as Llama (attention_bias, mlp_bias) with per-layer positions: no_rope_layers / no_rope_layer_interval -> "
         "layers: [{select: ..., positional: none}] (NoPE layers); use_sliding_window, sliding_window, layer_types (or, "
         "without it, the NoPE layers) -> per-layer windows",
    caveats="sliding layers need use_sliding_window",
)
