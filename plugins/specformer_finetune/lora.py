"""``lora``: low-rank adapters (Hu et al. 2021) on the chosen linear layers.

A wrapped layer computes ``base(x) + dropout(x) @ A.T @ B.T * alpha / rank`` with ``A``
``(rank, in)`` initialised like PEFT's (Kaiming-uniform) and ``B`` ``(out, rank)`` zero, so
the first forward equals the base model's exactly. The base layer (an ``nn.Linear`` or a
quantized one) is kept as it is and frozen; only ``A`` and ``B`` train.

The update is added by one ``addmm`` (``y + scaling * low @ B.T``): the scale, the product
and the sum happen in one kernel, forward and backward, so no tensor of the layer's output
size is made for the update alone (a wide fused projection such as ``gate_up`` otherwise
pays a multiply and an add over ``(tokens, out)`` each way). Dropout 0 runs no op at all.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from specformer.registry.params import Params, SubComponent


class AdapterParams(Params):
    """What every adapter shares: where it goes and how the frozen base is held."""

    targets: list[str] = Field(
        default_factory=lambda: ["blocks.*.attention.*"], min_length=1,
        description="Linear layers to adapt, by the model's own module paths with globs: `*` within a segment, "
                    "`**` across (e.g. `blocks.*.attention.qkv`, `blocks.*.ffn.*`).")
    base: SubComponent("quantization") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="Hold the frozen base weights at lower precision (a quantization scheme: bf16, int8); "
                    "null keeps them as loaded.")


class LoRAParams(AdapterParams):
    rank: int = Field(default=8, gt=0, le=4096, description="Rank r of the update B @ A.")
    alpha: float = Field(default=16.0, gt=0, description="The update is scaled by alpha / rank.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the adapter's input (training only).")
    init: Literal["kaiming", "gaussian"] = Field(
        default="kaiming", description="A's initialisation: kaiming (PEFT's default) or gaussian (std 1/rank); B is zero.")


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update."""

    def __init__(self, *, base: nn.Module, rank: int, alpha: float, dropout: float = 0.0,
                 init: str = "kaiming") -> None:
        super().__init__()
        self.base = base
        for param in base.parameters():
            param.requires_grad_(False)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.rank = rank
        self.scaling = alpha / rank
        device = next(base.buffers(), None)
        device = next(base.parameters(), device)
        where = device.device if device is not None else None
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=where))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=where))  # (out, r)
        if init == "kaiming":
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        else:
            nn.init.normal_(self.lora_A, std=1 / rank)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else None

    def forward(self, x: Tensor) -> Tensor:
        y = self.base(x)  # (..., out)
        inputs = self.dropout(x) if self.dropout is not None else x
        low = inputs.reshape(-1, self.in_features) @ self.lora_A.to(x.dtype).t()  # (N, r)
        # B.T laid out row-major (r, out): a copy of r * out numbers that lets the backward form B's
        # gradient as low.T @ grad (the long N dimension contiguous in both) instead of (grad.T @ low).T,
        # several times slower on CPU for a wide layer.
        b_t = self.lora_B.to(y.dtype).t().contiguous()  # (r, out)
        # y + scaling * low @ B.T in one kernel (autocast casts all three alike); y's dtype is the layer's.
        out = torch.addmm(y.reshape(-1, self.out_features), low.to(y.dtype), b_t, alpha=self.scaling)  # (N, out)
        return out.view(y.shape)

    def delta_weight(self) -> Tensor:
        """``B @ A * alpha / rank``, ``(out, in)``: what merging adds to the base weight."""
        return (self.lora_B @ self.lora_A) * self.scaling

    def extra_repr(self) -> str:
        return f"rank={self.rank}, scaling={self.scaling:g}"


class LoRA:
    """Low-rank adapters: each target linear layer gains a trainable update B @ A * alpha / rank (B starts at zero,
    so training starts from the base model exactly); the base weights stay frozen."""

    name = "lora"
    Params = LoRAParams

    def __init__(self, params: LoRAParams) -> None:
        self.params = params

    @classmethod
    def from_params(cls, params: LoRAParams) -> "LoRA":
        return cls(params)

    def wrap(self, linear: nn.Module) -> LoRALinear:
        p = self.params
        return LoRALinear(base=linear, rank=p.rank, alpha=p.alpha, dropout=p.dropout, init=p.init)
