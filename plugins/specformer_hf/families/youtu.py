"""Youtu-LLM (``model_type: youtu``, Youtu-LLM-2B): DeepSeek-V3's latent attention in Llama's pre-norm blocks with a
SwiGLU in every layer (no experts)."""

from __future__ import annotations

from specformer_hf.families.deepseek_v3 import LatentRope
from specformer_hf.parts.attention import LatentAttention
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import Layout, RMSNorm

#: transformers' YoutuConfig defaults (Youtu-LLM-2B's sizes; the latent attention's DeepseekV3Config's).
DEFAULTS = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 32,
    "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False, "rope_interleave": True,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="Youtu-LLM",
    model_type="youtu",
    architecture="YoutuForCausalLM",
    defaults=DEFAULTS,
    parts=[Sizes(), LatentRope(), Layout("prenorm"), RMSNorm(), LatentAttention(), GatedFFN()],
    maps="attention mla as DeepSeek-V3's (q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, "
         "attention_bias; YaRN mscale_all_dim on the scores), rope_interleave -> interleaved rope; SwiGLU "
         "(intermediate_size) in every layer",
    caveats="no biases on the SwiGLU (transformers' Qwen3MLP has none)",
    non_math_fields=("embedding_initializer_range",),
)
