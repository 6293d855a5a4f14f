"""xIELU: a piecewise activation with a learned quadratic positive side and a learned negative slope."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer_layers.ffn.xielu_params import XIELUParams


class XIELU(nn.Module):
    """xIELU (:class:`XIELUParams`): ``alpha_p`` and ``alpha_n`` are learned scalars, ``beta`` and ``eps`` constants."""

    Params = XIELUParams

    def __init__(self, params: XIELUParams | None = None) -> None:
        params = params if params is not None else XIELUParams()
        super().__init__()
        self.params = params
        raw_p, raw_n = params.raw_alphas()
        # One element each, as transformers stores them (mlp.act_fn.alpha_p / alpha_n).
        self.alpha_p = nn.Parameter(torch.tensor([raw_p]))
        self.alpha_n = nn.Parameter(torch.tensor([raw_n]))
        self.beta = params.beta
        self.eps = params.eps

    def forward(self, x: Tensor) -> Tensor:
        a_p = F.softplus(self.alpha_p)
        a_n = self.beta + F.softplus(self.alpha_n)
        positive = a_p * x * x + self.beta * x
        negative = (torch.expm1(x.clamp(max=self.eps)) - x) * a_n + self.beta * x
        return torch.where(x > 0, positive, negative)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        raw_p, raw_n = self.params.raw_alphas()
        with torch.no_grad():
            self.alpha_p.fill_(raw_p)
            self.alpha_n.fill_(raw_n)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, eps={self.eps}"
