"""Feed-forwards side by side, each between norms of its own, their outputs summed (Gemma 4's MLP beside its MoE)."""

from __future__ import annotations

import inspect

from torch import Tensor, nn

from specformer_layers.ffn.params import ParallelFFNParams


class ParallelFFN(nn.Module):
    """``sum_i post_i(ffn_i(pre_i(x)))`` (:class:`ParallelFFNParams`)."""

    Params = ParallelFFNParams

    def __init__(self, params: ParallelFFNParams, *, d_model: int, layer_index: int = 0, n_layers: int = 1) -> None:
        super().__init__()
        self.ffns = nn.ModuleList(ffn.make(d_model=d_model, layer_index=layer_index, n_layers=n_layers)
                                  for ffn in params.ffns)
        self.pre_norms = nn.ModuleList(params.norm.make(dim=d_model) for _ in params.ffns)
        self.post_norms = nn.ModuleList(params.norm.make(dim=d_model) for _ in params.ffns)
        self.route_unnormed = params.route_unnormed
        # Which branches route (a mixture's forward takes route_from): they read the unnormed input for routing.
        self.routes = [params.route_unnormed and "route_from" in inspect.signature(f.forward).parameters
                       for f in self.ffns]

    def forward(self, x: Tensor) -> Tensor:
        out = None
        for ffn, pre, post, routes in zip(self.ffns, self.pre_norms, self.post_norms, self.routes):
            y = post(ffn(pre(x), route_from=x) if routes else ffn(pre(x)))
            out = y if out is None else out + y
        return out  # a mixture among the branches reports its own active weights (summary reaches every module)
