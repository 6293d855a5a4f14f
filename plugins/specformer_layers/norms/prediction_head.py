"""BERT's prediction head in the final-norm slot (ModernBERT-decoder)."""

from __future__ import annotations

from torch import Tensor, nn

from specformer.model.parallel_plan import ParallelPlan
from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.norms.prediction_head_params import PredictionHeadParams


class PredictionHead(nn.Module):
    """``head_norm(act(dense(norm(x))))`` over the last ``dim`` channels; see :class:`PredictionHeadParams`."""

    Params = PredictionHeadParams

    def __init__(self, params: PredictionHeadParams | None = None, *, dim: int) -> None:
        params = params if params is not None else PredictionHeadParams()
        super().__init__()
        self.norm = params.norm.make(dim=dim)
        self.dense = nn.Linear(dim, dim, bias=params.bias)
        self.activation = ACTIVATIONS[params.activation]
        self.activation_name = params.activation
        self.head_norm = params.norm.make(dim=dim)

    def parallel_plan(self) -> ParallelPlan:
        """Replicated: a d_model x d_model layer on the last position's stream is small beside the LM head."""
        return {}

    def forward(self, x: Tensor) -> Tensor:
        return self.head_norm(self.activation(self.dense(self.norm(x))))

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.dense.weight, std=std)
        if self.dense.bias is not None:
            nn.init.zeros_(self.dense.bias)
        for norm in (self.norm, self.head_norm):
            if hasattr(norm, "init_weights"):
                norm.init_weights(std=std, residual_std=residual_std)

    def extra_repr(self) -> str:
        return f"activation={self.activation_name}"
