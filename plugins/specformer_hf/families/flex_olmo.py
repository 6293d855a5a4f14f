"""FlexOlmo (``model_type: flex_olmo``, FlexOlmo-7x7B-1T): OLMo-2's blocks (norms after each sublayer, RMSNorm over all
of q and k) with OLMoE's routed mixture of SwiGLU experts in every layer."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, MixtureOfExperts
from specformer_hf.parts.norms import Layout

#: transformers' FlexOlmoConfig defaults (FlexOlmo-7x7B-1T's sizes; rope theta 5e5, its default_theta).
DEFAULTS = {
    "vocab_size": 100352, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "num_experts_per_tok": 5,
    "num_experts": 7, "router_aux_loss_coef": 0.01, "norm_topk_prob": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}

# FlexOlmoConfig has no head_dim field, but the attention reads one if config.json has it (Attention does).
FAMILY = decoder_family(
    name="FlexOlmo",
    model_type="flex_olmo",
    architecture="FlexOlmoForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(LLAMA_PARTS, Layout("postnorm_inside")),
                      MixtureOfExperts(normalize="norm_topk_prob", n_experts_aliases=("num_local_experts",)),
                      instead_of=GatedFFN),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("all"),
    ],
    maps="as OLMo-2 (layout postnorm_inside, qk_norm RMSNorm over the whole q and k projections, attention_bias, rope) "
         "with OLMoE's ffn moe in every layer: num_experts, num_experts_per_tok, intermediate_size (each expert's "
         "width), softmax-then-top-k routing, norm_topk_prob",
    caveats="reads per-expert and fused 3-D expert tensors, writes per-expert",
)
