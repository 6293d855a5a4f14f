"""The two-layer MLP of the original transformer and GPT-2."""

from __future__ import annotations

from pydantic import Field
from torch import Tensor, nn

from specformer.registry.params import FromParams, Params
from specformer_layers.ffn.activations import ACTIVATIONS, Activation


class MLP(FromParams, nn.Module):
    """``fc_out(act(fc_in(x)))``, widening to ``hidden`` channels in between."""

    class Params(Params):
        hidden: int | None = Field(default=None, gt=0, description="Inner width; default 4 * d_model.")
        activation: Activation = Field(default="gelu", description="Non-linearity between the two projections.")
        bias: bool = Field(default=True, description="Biases on both projections.")
        dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the output.")

    def __init__(self, *, d_model: int, hidden: int | None = None, activation: str = "gelu", bias: bool = True,
                 dropout: float = 0.0) -> None:
        super().__init__()
        hidden = hidden or 4 * d_model
        self.fc_in = nn.Linear(d_model, hidden, bias=bias)
        self.fc_out = nn.Linear(hidden, d_model, bias=bias)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc_out(self.activation(self.fc_in(x))))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.fc_in.weight, std=std)
        nn.init.normal_(self.fc_out.weight, std=residual_std)  # feeds the residual stream
        for bias in (self.fc_in.bias, self.fc_out.bias):
            if bias is not None:
                nn.init.zeros_(bias)
