"""GLM-4 (``model_type: glm``, glm-4-9b): Llama's pre-norm blocks with an interleaved rope on part of each head
(half by default), q/k/v biases without an o_proj bias, and Phi-3's fused gate_up MLP."""

from __future__ import annotations

from specformer_hf.parts.base import Fixed, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.positions import Rope

#: transformers' GlmConfig defaults (glm-4-9b's sizes; partial_rotary_factor 0.5 unless the config says).
DEFAULTS = {
    "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 13696, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1.5625e-7, "tie_word_embeddings": False, "attention_bias": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}

#: GLM's parts, which GLM-4 (``glm4``) shares but for its norms' layout. The rope pairs adjacent channels
#: (apply_rotary_pos_emb's repeat_interleave) on the first partial_rotary_factor of each head; export always writes
#: the factor, since a config without one means 0.5.
PARTS = (
    *replace_part(replace_part(LLAMA_PARTS, Rope(partial=True, write_fraction=True, interleaved=True)),
                  GatedFFN(fused=True)),
    Switch("attention_bias", ("mixer.qkv_bias",)),
    Fixed("mixer.out_bias", False, why="has no bias on o_proj (attention_bias is on q, k and v only)"),
)

FAMILY = decoder_family(
    name="GLM",
    model_type="glm",
    architecture="GlmForCausalLM",
    defaults=DEFAULTS,
    parts=PARTS,
    maps="prenorm RMSNorm, rope interleaved (adjacent pairs) with partial_rotary_factor (default 0.5), GQA, head_dim, "
         "attention_bias on q/k/v, SwiGLU from the fused gate_up_proj",
    caveats="o_proj never has a bias; export always writes partial_rotary_factor (a missing one means 0.5)",
)
