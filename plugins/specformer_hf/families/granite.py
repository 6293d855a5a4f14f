"""Granite 3 (``model_type: granite``, granite-3.0/3.1/3.3 dense, PowerLM): Llama with Granite's muP multipliers.

Pre-norm RMSNorm blocks, rope, grouped-query attention and a SwiGLU feed-forward as Llama's;
``embedding_multiplier``, ``residual_multiplier``, ``attention_multiplier`` (the score scale) and
``logits_scaling`` (the logits' divisor) as :mod:`specformer_hf.parts.multipliers` maps them.
"""

from __future__ import annotations

from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.multipliers import AttentionMultiplier, Multipliers, ScaledResiduals
from specformer_hf.parts.norms import RMSNorm
from specformer_hf.parts.positions import Rope

#: transformers' GraniteConfig defaults (a saved config.json may leave any of these out).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0,
}

#: What a Granite 3 decoder is made of, less its feed-forward (granitemoe and granitemoeshared put experts there).
GRANITE_PARTS = (Sizes(), Rope(), ScaledResiduals(), RMSNorm(), Attention(), AttentionMultiplier(),
                 Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")), Multipliers())

FAMILY = decoder_family(
    name="Granite",
    model_type="granite",
    architecture="GraniteForCausalLM",
    defaults=DEFAULTS,
    parts=[*GRANITE_PARTS, GatedFFN(bias_key="mlp_bias")],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="Llama's fields; attention_multiplier -> mixer.scale; residual_multiplier -> layout.residual_multiplier; "
         "embedding_multiplier; logits_scaling -> logit_scale = 1 / logits_scaling",
    caveats="attention_bias applies to q, k, v and o alike (as in transformers)",
)
