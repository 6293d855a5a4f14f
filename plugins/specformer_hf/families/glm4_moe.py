"""GLM-4.5 (``model_type: glm4_moe``, GLM-4.5 / GLM-4.5-Air): Llama-style blocks with half of each head rotated,
q/k/v biases, optional per-head q/k RMSNorm, and DeepSeek-V3's sigmoid-routed experts after dense first layers."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import Fixed, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, GroupedExperts
from specformer_hf.parts.mtp import LayerMTP
from specformer_hf.parts.positions import Rope

#: transformers' Glm4MoeConfig defaults (GLM-4.5-Air's shapes; partial_rotary_factor 0.5 unless the config says).
DEFAULTS = {
    "vocab_size": 151552, "hidden_size": 4096, "intermediate_size": 10944, "num_hidden_layers": 46,
    "num_attention_heads": 96, "num_key_value_heads": 8, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False, "moe_intermediate_size": 1408,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "n_routed_experts": 128, "routed_scaling_factor": 1.0,
    "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "norm_topk_prob": True, "use_qk_norm": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}

#: The table, which the families transformers runs as GLM-4.5 (Param2, Sarvam-30B) reuse.
PARTS = (
    *replace_part(replace_part(LLAMA_PARTS, Rope(partial=True, write_fraction=True)), GroupedExperts(),
                  instead_of=GatedFFN),
    Switch("attention_bias", ("mixer.qkv_bias",)),
    Fixed("mixer.out_bias", False, why="has no bias on o_proj (attention_bias is on q, k and v only)"),
    QKNorm("head", switch="use_qk_norm"),
    LayerMTP(),
)

# Glm4MoeConfig has no head_dim field, but the attention reads one if config.json has it (Attention does).
FAMILY = decoder_family(
    name="GLM-4.5",
    model_type="glm4_moe",
    architecture="Glm4MoeForCausalLM",
    defaults=DEFAULTS,
    parts=PARTS,
    maps="rope with partial_rotary_factor (default 0.5: half of each head rotated), GQA, attention_bias on q/k/v, "
         "use_qk_norm -> qk_norm (RMSNorm per head); ffn moe as DeepSeek-V3's: router sigmoid_topk (norm_topk_prob, "
         "routed_scaling_factor, n_group, topk_group; e_score_correction_bias -> selection_bias), n_shared_experts, "
         "first_k_dense_replace -> dense layers; num_nextn_predict_layers -> mtp depths as DeepSeek-V3's (model.layers.46 "
         "or .92: enorm, hnorm, eh_proj, shared_head.norm and a decoder layer)",
    caveats="a file without the multi-token-prediction layers its config counts (transformers' save_pretrained leaves "
            "them out) imports without model.mtp, with a note; aux_loss_coef is 0 on import",
    # transformers' Glm4MoePreTrainedModel ignores exactly these (the MTP layer of the 46- and 92-layer models) when
    # a file has them beyond its layers; import reads them as model.mtp, and skips them only when no rule used them.
    ignore_tensors=(r"model\.layers\.46\..*", r"model\.layers\.92\..*"),
)
