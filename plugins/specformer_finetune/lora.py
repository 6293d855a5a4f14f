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
import torch
from torch import Tensor, nn

from specformer_finetune.params import LoRAParams


class LoRALinear(nn.Module):
    """A frozen linear layer plus a trainable low-rank update."""

    def __init__(self, params: LoRAParams, *, base: nn.Module) -> None:
        super().__init__()
        self.base = base
        for param in base.parameters():
            param.requires_grad_(False)
        self.in_features, self.out_features = base.in_features, base.out_features
        rank = self.rank = params.rank
        self.scaling = params.alpha / rank
        device = next(base.buffers(), None)
        device = next(base.parameters(), device)
        where = device.device if device is not None else None
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=where))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=where))  # (out, r)
        if params.init == "kaiming":
            nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        else:
            nn.init.normal_(self.lora_A, std=1 / rank)
        self.dropout = nn.Dropout(params.dropout) if params.dropout > 0 else None

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
    """Low-rank adapters on the target linear layers (described in :class:`LoRAParams`)."""

    name = "lora"
    Params = LoRAParams

    def __init__(self, params: LoRAParams) -> None:
        self.params = params

    def wrap(self, linear: nn.Module) -> LoRALinear:
        return LoRALinear(self.params, base=linear)
