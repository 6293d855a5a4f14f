"""DeepSeek-V2 (``model_type: deepseek_v2``, DeepSeek-V2 and V2-Lite): multi-head latent attention with rotary
channels turned in adjacent pairs, softmax-scored experts (greedy, or among the best groups), always-on shared
experts, and dense first layers."""

from __future__ import annotations

from specformer_hf.families.deepseek_v32 import PairedRope
from specformer_hf.parts.attention import LatentAttention
from specformer_hf.parts.base import Refuse
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GroupedExperts
from specformer_hf.parts.norms import Layout, RMSNorm

#: transformers' DeepseekV2Config defaults (a mix of DeepSeek-V2's and V2-Lite's sizes; num_experts_per_tok unset).
DEFAULTS = {
    "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
    "first_k_dense_replace": 0, "kv_lora_rank": 512, "q_lora_rank": 1536, "n_group": None, "n_routed_experts": 64,
    "n_shared_experts": 2, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "routed_scaling_factor": 1.0,
    "topk_group": None, "topk_method": "greedy", "norm_topk_prob": False, "v_head_dim": 128,
    "num_experts_per_tok": None, "moe_intermediate_size": 1407,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="DeepSeek-V2",
    model_type="deepseek_v2",
    architecture="DeepseekV2ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(), PairedRope(), Layout("prenorm"), RMSNorm(), LatentAttention(), GroupedExperts(softmax=True),
        # LlamaMLP's biases, on the dense layers and the shared experts alike: specformer's shared experts have none.
        Refuse("mlp_bias", (False,), why="biases on the dense layers' and shared experts' projections: specformer's "
                                         "shared experts have no biases"),
        # The original remote code's fields that transformers does not read; only their published values match it.
        Refuse("moe_layer_freq", (1, None), optional=True,
               why="transformers' DeepSeek-V2 puts experts in every layer from first_k_dense_replace on"),
        Refuse("scoring_func", ("softmax", None), optional=True, why="transformers' DeepSeek-V2 scores experts by softmax"),
    ],
    maps="attention mla (q_lora_rank or none, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim, "
         "attention_bias; YaRN mscale_all_dim on the scores), rotary channels in adjacent pairs (interleaved rope); ffn "
         "moe with router softmax_topk (normalize false, routed_scaling_factor; topk_method greedy, or "
         "group_limited_greedy with n_group, topk_group), n_shared_experts, first_k_dense_replace -> dense layers",
    caveats="norm_topk_prob is not read: transformers' DeepSeek-V2 never renormalises the chosen experts' weights "
            "(true is reported as ignored); mlp_bias must be false, moe_layer_freq 1 and scoring_func softmax (as "
            "published); aux_loss_coef is 0 on import",
    # The original remote code's training and parallelism settings; transformers reads none of them.
    non_math_fields=("aux_loss_alpha", "seq_aux", "ep_size"),
)
