"""Qwen2-MoE (``model_type: qwen2_moe``, Qwen1.5-MoE and Qwen2-57B-A14B): Qwen2's attention, routed experts plus
one gated shared expert, optional dense layers."""

from __future__ import annotations

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import Fixed, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, MixtureOfExperts
from specformer_hf.parts.windows import SwitchedWindows

#: transformers' Qwen2MoeConfig defaults.
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 24,
    "num_attention_heads": 16, "num_key_value_heads": 16, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": 4096,
    "max_window_layers": 28, "decoder_sparse_step": 1, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False,
    "router_aux_loss_coef": 0.001, "mlp_only_layers": None, "qkv_bias": True, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def sliding_by_default(cfg: ConfigReader, n_layers: int) -> list[bool]:
    """Qwen2MoeConfig without layer_types: the even layers below max_window_layers slide (Qwen2 slides those from it on)."""
    first_full = cfg.get_int("max_window_layers")
    return [i % 2 == 0 and i < first_full for i in range(n_layers)]


FAMILY = decoder_family(
    name="Qwen2-MoE",
    model_type="qwen2_moe",
    architecture="Qwen2MoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, MixtureOfExperts(hidden="moe_intermediate_size", normalize="norm_topk_prob",
                                                    shared=True, dense=True), instead_of=GatedFFN),
        Switch("qkv_bias", ("mixer.qkv_bias",)),
        Fixed("mixer.out_bias", False, why="has no o_proj bias"),
        SwitchedWindows(sliding_by_default),
    ],
    maps="as Qwen2 (qkv_bias switch) with ffn moe: num_experts, num_experts_per_tok, moe_intermediate_size, norm_topk_prob, "
         "one shared expert (shared_expert_intermediate_size) gated by sigmoid(shared_expert_gate); decoder_sparse_step "
         "and mlp_only_layers -> dense layers (layers: overrides); use_sliding_window, sliding_window, layer_types (or, "
         "without it, the even layers below max_window_layers) -> per-layer windows",
    caveats="reads per-expert and fused 3-D expert tensors, writes per-expert; sliding layers need use_sliding_window",
)
