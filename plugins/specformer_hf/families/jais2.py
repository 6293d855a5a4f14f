"""Jais 2 (``model_type: jais2``, Jais-2-8B): Arcee's decoder with biased LayerNorms, and biases on by default."""

from __future__ import annotations

from specformer_hf.families import arcee
from specformer_hf.parts.decoder import decoder_family, replace_part
from specformer_hf.parts.norms import LayerNorm, Layout, RMSNorm

#: transformers' Jais2Config defaults (Jais-2-8B's sizes, its docstring's checkpoint).
DEFAULTS = {
    "vocab_size": 150272, "hidden_size": 3328, "intermediate_size": 26624, "num_hidden_layers": 32,
    "num_attention_heads": 26, "num_key_value_heads": None, "head_dim": None, "hidden_act": "relu2",
    "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "tie_word_embeddings": False,
    "attention_bias": True, "mlp_bias": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Jais2",
    model_type="jais2",
    architecture="Jais2ForCausalLM",
    defaults=DEFAULTS,
    parts=replace_part(replace_part(arcee.PARTS, Layout("prenorm", norm_bias=True)), LayerNorm(), instead_of=RMSNorm),
    ignore_tensors=arcee.FAMILY.ignore_tensors,
    maps="as Arcee (rope, GQA, head_dim, an ungated mlp: up_proj, down_proj, hidden_act relu2 by default) with "
         "prenorm LayerNorms with biases (layer_norm_eps, the final norm's bias too); attention_bias and mlp_bias "
         "(both on by default)",
    caveats="attention_bias applies to q, k, v and o alike (as in transformers); hidden_size must be a multiple of "
            "num_attention_heads (transformers' Jais2Config refuses others)",
)
