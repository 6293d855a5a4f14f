"""DiffLlama (``model_type: diffllama``): Llama's blocks with differential attention (Ye et al. 2024,
arXiv:2410.05258): heads i and i + n_heads/2 pair, their two softmax maps subtracted with a learned lambda."""

from __future__ import annotations

from specformer_hf.parts.attention import Differential
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family

#: transformers' DiffLlamaConfig defaults.
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "lambda_std_dev": 0.1, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="DiffLlama",
    model_type="diffllama",
    architecture="DiffLlamaForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *LLAMA_PARTS,
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Differential(),
    ],
    maps="as Llama (prenorm RMSNorm, rope, GQA, head_dim, SwiGLU without biases, attention_bias) with differential "
         "attention (differential: true): the lambda_q1/k1/q2/k2 vectors per layer, lambda_init by layer index, each "
         "head pair normalised by an RMSNorm without a weight (eps rms_norm_eps) and scaled by 1 - lambda_init",
    caveats="num_key_value_heads must be even (as transformers requires); attention_bias applies to q, k, v and o "
            "alike; lambda_std_dev (initialisation only) is exported as 0.1",
)
