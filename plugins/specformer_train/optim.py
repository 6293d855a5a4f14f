"""AdamW with weight decay on matrices only.

Matrices (embeddings and linear weights, >= 2-D) are decayed; vectors (norm scales,
biases) are not, since shrinking a norm's gain or a bias towards zero is not
regularisation but a bias of its own (as in GPT-2 / nanoGPT / Llama training). On CUDA
the fused kernel updates all parameters in a few launches; on CPU the foreach path.
"""

from __future__ import annotations

import torch
from torch import nn

from specformer_train.config import TrainConfig


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict]:
    """Two AdamW groups: ``>= 2``-D trainable parameters with ``weight_decay``, the rest without."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, config: TrainConfig, *, device: torch.device) -> torch.optim.AdamW:
    fused = device.type == "cuda"
    return torch.optim.AdamW(
        param_groups(model, weight_decay=config.weight_decay),
        lr=config.lr,
        betas=tuple(config.betas),
        eps=config.eps,
        fused=fused or None,
        foreach=None if fused else True,
    )
