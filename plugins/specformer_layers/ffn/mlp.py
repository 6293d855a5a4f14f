"""The two-layer MLP of the original transformer and GPT-2."""

from __future__ import annotations

from torch import Tensor, nn
from specformer.model.parallel_plan import ParallelPlan, Shared, Split

from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.ffn.params import MLPParams


class MLP(nn.Module):
    """``fc_out(act(fc_in(x)))``, widening to ``hidden`` channels in between (:class:`MLPParams`)."""

    Params = MLPParams

    def __init__(self, params: MLPParams | None = None, *, d_model: int) -> None:
        params = params if params is not None else MLPParams()
        super().__init__()
        hidden = params.hidden_for(d_model)
        bias = params.bias
        self.fc_in = nn.Linear(d_model, hidden, bias=bias)
        self.fc_out = nn.Linear(hidden, d_model, bias=bias)
        # A fixed function by name, or a learned activation component (a module with parameters of its own).
        activation = params.activation
        self.activation = ACTIVATIONS[activation] if isinstance(activation, str) else activation.make()
        self.dropout = nn.Dropout(params.dropout)

    def parallel_plan(self) -> ParallelPlan:
        """Hidden channels over tp: the first projection by its rows, the second by its inputs (its bias replicated)."""
        hidden = self.fc_in.out_features
        plan: ParallelPlan = {"fc_in.weight": (Split("tp", 0, hidden, "hidden channels"),),
                              "fc_in.bias": (Split("tp", 0, hidden, "hidden channels"),),
                              "fc_out.weight": (Split("tp", 1, hidden, "hidden channels"),)}
        # A learned activation's parameters are kept whole, each device applying them to its own hidden channels:
        # their gradients are summed.
        if isinstance(self.activation, nn.Module):
            plan.update({f"activation.{name}": (Shared("tp"),) for name, _ in self.activation.named_parameters()})
        return plan

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.fc_out(self.activation(self.fc_in(x))))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.fc_in.weight, std=std)
        nn.init.normal_(self.fc_out.weight, std=residual_std)  # feeds the residual stream
        for bias in (self.fc_in.bias, self.fc_out.bias):
            if bias is not None:
                nn.init.zeros_(bias)
        if isinstance(self.activation, nn.Module) and hasattr(self.activation, "init_weights"):
            self.activation.init_weights(std=std, residual_std=residual_std)
