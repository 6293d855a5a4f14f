"""dots.llm1 (``model_type: dots1``, rednote-hilab/dots.llm1): Qwen3's attention (per-head q/k RMSNorm, biases on q, k, v
and o) in DeepSeek-V3's blocks: sigmoid-routed experts with a selection bias, shared experts, dense first layers."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, GroupedExperts
from specformer_hf.parts.windows import QwenWindows

#: transformers' Dots1Config defaults (it has none for the experts' counts: a config.json must give them).
DEFAULTS = {
    "vocab_size": 152064, "hidden_size": 4608, "intermediate_size": 10944, "moe_intermediate_size": 1408,
    "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": None,
    "n_routed_experts": None, "num_experts_per_tok": None, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 0,
    "norm_topk_prob": False, "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "attention_bias": False, "routed_scaling_factor": 1.0, "sliding_window": 4096,
    "max_window_layers": 62, "layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

# Dots1Config has no head_dim field, but the attention reads one if config.json has it (Attention does).
FAMILY = decoder_family(
    name="dots.llm1",
    model_type="dots1",
    architecture="Dots1ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, GroupedExperts(), instead_of=GatedFFN),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("head"),
        # No use_sliding_window: a sliding_window slides the layers from max_window_layers on (or as layer_types say).
        QwenWindows(switch=None),
    ],
    maps="as Qwen3's attention (qk_norm RMSNorm per head, attention_bias on q, k, v and o, head_dim); sliding_window "
         "with max_window_layers or layer_types -> per-layer windows; ffn moe as DeepSeek-V3's: router sigmoid_topk "
         "(norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias -> selection_bias), "
         "n_shared_experts, first_k_dense_replace -> dense layers",
    caveats="aux_loss_coef is 0 on import; one sliding_window for every sliding layer",
)
