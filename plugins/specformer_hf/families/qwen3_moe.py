"""Qwen3-MoE (``model_type: qwen3_moe``, Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3's attention, routed experts, optional
dense layers."""

from __future__ import annotations

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, MixtureOfExperts
from specformer_hf.parts.windows import SwitchedWindows

#: transformers' Qwen3MoeConfig defaults.
DEFAULTS = {
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
    "num_attention_heads": 32, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "use_sliding_window": False,
    "sliding_window": 4096, "decoder_sparse_step": 1, "moe_intermediate_size": 768, "num_experts_per_tok": 8,
    "num_experts": 128, "norm_topk_prob": False, "router_aux_loss_coef": 0.001, "mlp_only_layers": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def every_layer_slides(cfg: ConfigReader, n_layers: int) -> list[bool]:
    """Qwen3MoeConfig has no layer_types: with use_sliding_window every layer slides. max_window_layers, in the
    published configs, is not read by transformers 5's Qwen3-MoE (nor here)."""
    cfg.mark_read("max_window_layers")
    return [True] * n_layers


FAMILY = decoder_family(
    name="Qwen3-MoE",
    model_type="qwen3_moe",
    architecture="Qwen3MoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, MixtureOfExperts(hidden="moe_intermediate_size", normalize="norm_topk_prob", dense=True,
                                                     n_experts_aliases=("num_local_experts",)),
                      instead_of=GatedFFN),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("head"),
        SwitchedWindows(every_layer_slides, layer_types=False),
    ],
    maps="as Qwen3 (per-head q/k RMSNorm, attention_bias) with ffn moe: num_experts, num_experts_per_tok, "
         "moe_intermediate_size, norm_topk_prob; decoder_sparse_step and mlp_only_layers -> dense layers; "
         "use_sliding_window and sliding_window -> the same window on every layer",
    caveats="reads per-expert and fused 3-D expert tensors, writes per-expert; windows slide on every layer or none "
            "(max_window_layers is not read, as in transformers 5)",
)
