"""ERNIE 4.5 dense (``model_type: ernie4_5``, ERNIE-4.5-0.3B): Llama's pre-norm blocks with an interleaved rope over
whole heads (adjacent channel pairs, as GLM rotates them) and one use_bias switch for every projection."""

from __future__ import annotations

from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.positions import Rope

#: transformers' Ernie4_5Config defaults (ERNIE-4.5-0.3B's sizes; its default_theta is 500000).
DEFAULTS = {
    "vocab_size": 103424, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 18,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "use_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}

FAMILY = decoder_family(
    name="ERNIE 4.5",
    model_type="ernie4_5",
    architecture="Ernie4_5ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        # Ernie4_5's apply_rotary_pos_emb pairs adjacent channels across the whole head (no partial rotation).
        *replace_part(LLAMA_PARTS, Rope(interleaved=True)),
        # use_bias is on q, k, v, o and the three MLP projections alike (the LM head never has one).
        Switch("use_bias", ("mixer.qkv_bias", "mixer.out_bias", "ffn.bias")),
    ],
    maps="prenorm RMSNorm, rope interleaved (adjacent pairs) over whole heads (theta; default 500000), GQA, head_dim, "
         "SwiGLU, use_bias -> biases on q, k, v, o and the MLP projections, tied or untied head",
    caveats="use_bias switches every projection's bias together; partial_rotary_factor is refused (ERNIE 4.5 "
            "rotates whole heads)",
)
