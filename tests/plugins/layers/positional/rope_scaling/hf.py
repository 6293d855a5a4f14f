"""transformers' RoPE init functions and rotary module, configured like one of our specs."""

from __future__ import annotations

from typing import Any

import torch


def hf_config(*, head_dim: int, theta: float, context_length: int, fraction: float = 1.0, **rope: Any) -> Any:
    from transformers import LlamaConfig

    parameters = {"rope_theta": theta, **rope}
    if fraction != 1.0:
        parameters["partial_rotary_factor"] = fraction
    return LlamaConfig(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                       max_position_embeddings=context_length, rope_parameters=parameters)


def hf_init(rope_type: str, config: Any, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", seq_len=seq_len)


def hf_cos_sin(config: Any, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (B, T, rotary_dim) from transformers' rotary module, attention scaling applied."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config)
    return rotary(torch.zeros(1), positions)
