"""A block's per-layer input gated into the residual stream (Gemma 3n, Gemma 4)."""

from __future__ import annotations

from torch import Tensor, nn

from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.ffn.params import Activation


class PerLayerGate(nn.Module):
    """``x + norm(proj(act(x G) * p))``: the stream ``x`` (B, T, d) chooses, channel by channel of the per-layer
    input ``p`` (B, T, width), what of it to add; ``G`` is d -> width, ``proj`` width -> d."""

    def __init__(self, *, d_model: int, width: int, activation: Activation, norm: nn.Module) -> None:
        super().__init__()
        self.gate = nn.Linear(d_model, width, bias=False)
        self.projection = nn.Linear(width, d_model, bias=False)
        self.norm = norm
        self.act = ACTIVATIONS[activation]

    def forward(self, x: Tensor, per_layer_input: Tensor) -> Tensor:
        return x + self.norm(self.projection(self.act(self.gate(x)) * per_layer_input))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.gate.weight, std=std)
        nn.init.normal_(self.projection.weight, std=residual_std)  # feeds the residual stream
