"""Gemma (``model_type: gemma``): Llama's blocks with (1 + w) RMSNorms, sqrt(d) embedding scale, GeGLU, tied head."""

from __future__ import annotations

from specformer_hf.parts.base import Refuse, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.embedding import EmbeddingScale
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import RMSNorm

#: transformers' GemmaConfig defaults.
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 3072, "intermediate_size": 24576, "num_hidden_layers": 28,
    "num_attention_heads": 16, "num_key_value_heads": 16, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "use_bidirectional_attention": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Gemma",
    model_type="gemma",
    architecture="GemmaForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Refuse("use_bidirectional_attention", (None, False), why="Gemma with bidirectional attention is not a causal LM"),
        *replace_part(replace_part(LLAMA_PARTS, RMSNorm(offset=1.0)), GatedFFN(gemma_gelu=True)),
        EmbeddingScale(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
    ],
    maps="as Llama with rmsnorm offset 1 (weights stored as w, applied as 1 + w), embedding_multiplier sqrt_d_model, GeGLU (tanh GELU)",
    caveats='hidden_act "gelu" is read as the tanh approximation, as transformers does for Gemma',
)
