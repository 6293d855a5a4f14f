"""GLM-4-0414 (``model_type: glm4``, GLM-4-9B-0414, GLM-4-32B-0414): GLM with sandwich norms, a norm after the
attention and after the MLP inside each residual branch."""

from __future__ import annotations

from specformer_hf.families.glm import PARTS
from specformer_hf.parts.decoder import decoder_family, replace_part
from specformer_hf.parts.norms import Layout

#: transformers' Glm4Config defaults (the 9B's sizes; partial_rotary_factor 0.5 unless the config says).
DEFAULTS = {
    "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-7, "tie_word_embeddings": False, "attention_bias": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}

#: Glm4DecoderLayer's names for the four norms of a sandwich block: post_attention_layernorm is the MLP's pre-norm.
SANDWICH_NAMES = (("attention_norm", "input_layernorm"), ("attention_post_norm", "post_self_attn_layernorm"),
                  ("ffn_norm", "post_attention_layernorm"), ("ffn_post_norm", "post_mlp_layernorm"))

FAMILY = decoder_family(
    name="GLM-4-0414",
    model_type="glm4",
    architecture="Glm4ForCausalLM",
    defaults=DEFAULTS,
    parts=replace_part(PARTS, Layout("sandwich", names=SANDWICH_NAMES)),
    maps="as GLM (interleaved rope with partial_rotary_factor, attention_bias on q/k/v, fused gate_up_proj) with "
         "layout sandwich: post_self_attn_layernorm and post_mlp_layernorm after the attention and the MLP",
    caveats="o_proj never has a bias; post_attention_layernorm is the MLP's pre-norm; export always writes "
            "partial_rotary_factor (a missing one means 0.5)",
)
