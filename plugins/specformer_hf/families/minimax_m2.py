"""MiniMax-M2 (``model_type: minimax_m2``): grouped-query attention with q/k RMSNorm over all heads and part of each
head rotated, and Mixtral-style experts chosen by sigmoid scores plus a selection-only bias."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import LAYER, MLP, Refuse
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, MixtureOfExperts
from specformer_hf.parts.positions import Rope

#: transformers' MiniMaxM2Config defaults (MiniMax-M2's shapes but for rotary_dim, which its config.json adds).
DEFAULTS = {
    "vocab_size": 200064, "hidden_size": 3072, "intermediate_size": 1536, "num_hidden_layers": 62,
    "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 196608, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "num_experts_per_tok": 8,
    "num_local_experts": 256, "router_aux_loss_coef": 0.001, "router_jitter_noise": 0.0,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0},
}

FAMILY = decoder_family(
    name="MiniMax-M2",
    model_type="minimax_m2",
    architecture="MiniMaxM2ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(LLAMA_PARTS, Rope(partial=True, rotary_dim_key="rotary_dim")),
                      MixtureOfExperts(n_experts="num_local_experts", saved=f"{LAYER}.block_sparse_moe", gate="w1",
                                       up="w3", down="w2",
                                       selection_bias=(f"{LAYER}.block_sparse_moe.e_score_correction_bias",
                                                       f"{MLP}.e_score_correction_bias")),
                      instead_of=GatedFFN),
        QKNorm("all"),
        # Not MiniMaxM2Config fields: MiniMax's own config.json has them, transformers' attention never reads them.
        Refuse("use_qk_norm", (None, True), why="transformers' MiniMax-M2 always normalises queries and keys",
               optional=True),
        Refuse("qk_norm_type", (None, "per_layer"),
               why="transformers' MiniMax-M2 normalises queries and keys over all heads of a layer at once", optional=True),
    ],
    maps="GQA with head_dim, q/k RMSNorm over all heads (qk_norm_scope all), rope with partial_rotary_factor or "
         "rotary_dim (/ head_dim); ffn moe: num_local_experts, num_experts_per_tok, intermediate_size, router "
         "sigmoid_topk renormalised (e_score_correction_bias -> selection_bias), router_aux_loss_coef -> aux_loss_coef",
    caveats="no biases; the q/k norms are always on and span all heads (use_qk_norm false or a qk_norm_type other "
            "than per_layer is refused: transformers reads neither); router_jitter_noise is training-only; reads the per-expert layout transformers saves "
            "(block_sparse_moe.experts.j.w1/w2/w3) and the fused 3-D one, writes the per-expert one",
    non_math_fields=("router_jitter_noise",),
)
