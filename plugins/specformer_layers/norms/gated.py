"""A norm with a low-rank, input-dependent sigmoid gate on its output (A.X-K2's gated RMSNorm)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specformer.model.parallel_plan import ParallelPlan
from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.norms.gated_params import GatedNormParams


class GatedNorm(nn.Module):
    """``y * sigmoid(up(act(down(y))))`` with ``y = norm(x)``; see :class:`GatedNormParams`."""

    Params = GatedNormParams

    def __init__(self, params: GatedNormParams | None = None, *, dim: int) -> None:
        params = params if params is not None else GatedNormParams()
        super().__init__()
        self.norm = params.norm.make(dim=dim)
        self.down = nn.Linear(dim, params.rank, bias=False)
        self.up = nn.Linear(params.rank, dim, bias=False)
        self.activation = ACTIVATIONS[params.activation]
        self.activation_name = params.activation

    def parallel_plan(self) -> ParallelPlan:
        """Replicated: the gate is two thin d_model x rank projections on the stream every process holds."""
        return {}

    def forward(self, x: Tensor) -> Tensor:
        y = self.norm(x)
        logits = self.up(self.activation(self.down(y)))
        # The sigmoid in float32 at least, as A.X-K2's reference computes it for bfloat16 models.
        return (y * torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32)))).to(y.dtype)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        for linear in (self.down, self.up):
            nn.init.normal_(linear.weight, std=std)
        if hasattr(self.norm, "init_weights"):
            self.norm.init_weights(std=std, residual_std=residual_std)

    def extra_repr(self) -> str:
        return f"rank={self.down.out_features}, activation={self.activation_name}"
