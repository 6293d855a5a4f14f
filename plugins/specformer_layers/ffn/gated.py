"""Gated linear unit feed-forward networks: SwiGLU, GeGLU, ReGLU (Shazeer 2020)."""

from __future__ import annotations

from torch import Tensor, nn
from specformer.model.parallel_plan import ParallelPlan, Split

from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.ffn.params import GatedMLPParams, default_gated_hidden


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))``: the gate and up projections run as one matmul (:class:`GatedMLPParams`)."""

    Params = GatedMLPParams

    def __init__(self, params: GatedMLPParams | None = None, *, d_model: int) -> None:
        params = params if params is not None else GatedMLPParams()
        super().__init__()
        hidden = params.hidden_for(d_model)
        self.hidden = hidden
        if params.linear is None:
            self.gate_up = nn.Linear(d_model, 2 * hidden, bias=params.bias)  # rows: [gate; up]
            self.down = nn.Linear(hidden, d_model, bias=params.bias)
        else:  # the spec's linear kind (BitLinear), same weights; gate and up each keep their own scale
            self.gate_up = params.linear.make(in_features=d_model, out_features=2 * hidden, bias=params.bias,
                                              splits=(hidden, hidden))
            self.down = params.linear.make(in_features=hidden, out_features=d_model, bias=params.bias)
        # BitNet's ffn_sub_norm, over the hidden channels before the down projection.
        self.inner_norm = params.inner_norm.make(dim=hidden) if params.inner_norm is not None else None
        self.activation = ACTIVATIONS[params.activation]
        self.dropout = nn.Dropout(params.dropout)
        self.gate_multiplier = params.gate_multiplier
        self.output_multiplier = params.output_multiplier

    def parallel_plan(self) -> ParallelPlan:
        """Hidden channels over tp: the gate and up rows each split alike, the down projection by its inputs."""
        if self.inner_norm is not None or type(self.down) is not nn.Linear:
            raise ValueError("tensor parallelism does not split a gated MLP with inner_norm or a linear kind yet: the "
                             "norm and BitLinear's absmean and absmax scales read every hidden channel, not one device's")
        rows = tuple(Split("tp", 0, self.hidden, "hidden channels", rows=self.hidden) for _ in ("gate", "up"))
        return {"gate_up.weight": rows, "gate_up.bias": rows,
                "down.weight": (Split("tp", 1, self.hidden, "hidden channels"),)}

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # (B, T, hidden) each
        if self.gate_multiplier != 1.0:
            gate = gate * self.gate_multiplier
        inner = self.activation(gate) * up  # (B, T, hidden)
        if self.inner_norm is not None:
            inner = self.inner_norm(inner)
        out = self.down(inner)
        if self.output_multiplier != 1.0:
            out = out * self.output_multiplier
        return self.dropout(out)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.gate_up.weight, std=std)
        nn.init.normal_(self.down.weight, std=residual_std)
        for bias in (self.gate_up.bias, self.down.bias):
            if bias is not None:
                nn.init.zeros_(bias)


__all__ = ["GatedMLP", "default_gated_hidden"]
