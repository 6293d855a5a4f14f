"""Gated linear unit feed-forward networks: SwiGLU, GeGLU, ReGLU (Shazeer 2020)."""

from __future__ import annotations

from pydantic import Field
from torch import Tensor, nn

from specformer.registry.params import FromParams, Params
from specformer_layers.ffn.activations import ACTIVATIONS, Activation


def default_gated_hidden(d_model: int, multiple_of: int = 64) -> int:
    """Two thirds of 4 * d_model (same parameter count as a 4x MLP), rounded up to ``multiple_of``."""
    hidden = int(2 * 4 * d_model / 3)
    return (hidden + multiple_of - 1) // multiple_of * multiple_of


def gated_params(default_activation: str) -> type[Params]:
    class GatedParams(Params):
        hidden: int | None = Field(default=None, gt=0, description="Inner width; default 8/3 * d_model rounded up to 64.")
        activation: Activation = Field(default=default_activation, description="Non-linearity on the gate.")
        bias: bool = Field(default=False, description="Biases on the projections.")
        dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the output.")

    GatedParams.__name__ = GatedParams.__qualname__ = f"GatedParams_{default_activation}"
    return GatedParams


class GatedMLP(FromParams, nn.Module):
    """``down(act(gate(x)) * up(x))``: the gate and up projections run as one matmul."""

    def __init__(self, *, d_model: int, hidden: int | None = None, activation: str = "silu", bias: bool = False,
                 dropout: float = 0.0) -> None:
        super().__init__()
        hidden = hidden or default_gated_hidden(d_model)
        self.hidden = hidden
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=bias)  # rows: [gate; up]
        self.down = nn.Linear(hidden, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, hidden) each
        return self.dropout(self.down(self.activation(gate) * up))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.gate_up.weight, std=std)
        nn.init.normal_(self.down.weight, std=residual_std)
        for bias in (self.gate_up.bias, self.down.bias):
            if bias is not None:
                nn.init.zeros_(bias)
