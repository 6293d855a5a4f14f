"""OLMoE (``model_type: olmoe``, OLMoE-1B-7B): Llama's pre-norm blocks, RMSNorm over all of q and k (as OLMo-2), and a
routed mixture of SwiGLU experts in every layer; clip_qkv clamps the queries and keys after their norms, the values
as projected."""

from __future__ import annotations

from specformer_hf.parts.attention import Attention, ClipQKV, QKNorm
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, MixtureOfExperts

#: transformers' OlmoeConfig defaults (OLMoE-1B-7B's sizes).
DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 2048, "num_hidden_layers": 16,
    "num_attention_heads": 16, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False, "clip_qkv": None,
    "num_experts_per_tok": 8, "num_experts": 64, "router_aux_loss_coef": 0.01, "norm_topk_prob": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="OLMoE",
    model_type="olmoe",
    architecture="OlmoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        # The q/k norms are sized hidden_size and (hidden_size / heads) * kv heads: head_dim is hidden / heads.
        *replace_part(replace_part(LLAMA_PARTS, Attention(head_dim=False)),
                      MixtureOfExperts(normalize="norm_topk_prob", n_experts_aliases=("num_local_experts",)),
                      instead_of=GatedFFN),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("all"),
        ClipQKV(order="after_qk_norm"),
    ],
    maps="as OLMo-2's attention in Llama's prenorm blocks: qk_norm RMSNorm over the whole q and k projections "
         "(qk_norm_scope all), attention_bias, rope, clip_qkv (queries and keys clamped after their norm: "
         "clip_qkv_order after_qk_norm); ffn moe in every layer: num_experts, num_experts_per_tok, "
         "intermediate_size (each expert's width), softmax-then-top-k routing, norm_topk_prob",
    caveats="head_dim is always hidden / heads; reads "
            "per-expert and fused 3-D expert tensors, writes per-expert",
)
