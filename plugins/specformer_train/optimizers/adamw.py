"""``adamw``: AdamW (Loshchilov & Hutter 2019) with decoupled weight decay, torch's implementation.

By default matrices (embeddings, head, hidden projections) decay by ``train.weight_decay``
and vectors (norm scales, biases) do not: shrinking a norm's gain or a bias towards zero is
not regularisation but a bias of its own (GPT-2 / nanoGPT / Llama training). On CUDA the
fused kernel updates all parameters in a few launches; elsewhere the foreach path. With
no ``groups`` rules this is exactly the optimizer specformer always trained with.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import Field, StrictBool
from torch import nn

from specformer.registry.params import Params
from specformer_train.config import Float, TrainConfig
from specformer_train.optimizers.groups import GroupRule, build_groups


class AdamWParams(Params):
    """Settings of ``adamw``; learning rate, betas, eps and weight decay come from ``train:``."""

    groups: list[GroupRule] = Field(
        default_factory=list, description="Rules that change the lr / weight decay of some parameters."
    )
    fused: StrictBool | Literal["auto"] = Field(
        default="auto", description="auto: torch's fused kernel on CUDA, the foreach path elsewhere."
    )
    betas: tuple[Float, Float] | None = Field(default=None, description="(beta1, beta2); default train.betas.")
    eps: Float | None = Field(default=None, gt=0, description="Epsilon; default train.eps.")


def decay_matrices(config: TrainConfig) -> Any:
    """Default settings of a role: train.lr, train.weight_decay on matrices and none on vectors."""

    def defaults(role: str, name: str, param: nn.Parameter) -> dict[str, Any]:
        return {"lr": config.lr, "weight_decay": 0.0 if role == "vector" else config.weight_decay}

    return defaults


def make_adamw(params: AdamWParams, *, model: nn.Module, train: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW with decoupled weight decay on matrices only (fused on CUDA, foreach elsewhere)."""
    fused = device.type == "cuda" if params.fused == "auto" else params.fused
    return torch.optim.AdamW(
        build_groups(model, train, params.groups, decay_matrices(train)),
        lr=train.lr,
        betas=tuple(params.betas or train.betas),
        eps=params.eps or train.eps,
        fused=fused or None,
        foreach=None if fused else True,
    )
