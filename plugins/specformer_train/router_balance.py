"""Auxiliary-loss-free load balancing of MoE routers (Wang et al. 2024; DeepSeek-V3).

A router that balances by bias chooses experts by score plus a per-expert
``selection_bias`` and counts, while training, the routing slots each expert received
(``observed_load``). After every optimizer step the trainer calls
:func:`balance_routers`: each expert's bias moves by ``bias_update_rate`` towards
balance, ``bias_e += rate * sign(mean_load - load_e)``, up for an expert that received
fewer tokens than the mean, down for one that received more. The counts then start over.

Any module with the three attributes of :class:`BiasBalanced` takes part (the built-in
``sigmoid_topk`` router has them; a plugin's router needs nothing else). Under data
parallelism the counts are summed over processes first, so every process applies the
same update and the biases stay identical.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from specformer_train.parallel.layout import ParallelLayout


@runtime_checkable
class BiasBalanced(Protocol):
    """What a router exposes to be balanced by bias."""

    #: One value per expert, added to the scores only to choose experts (a float32 buffer).
    selection_bias: Tensor
    #: How far one step moves a bias (DeepSeek-V3's gamma); 0 leaves it alone.
    bias_update_rate: float
    #: Routing slots per expert counted by training forwards since the last update, or None.
    observed_load: Tensor | None


def balance_routers(model: nn.Module, ctx: ParallelLayout | None = None) -> int:
    """Apply one bias update to every router of ``model`` that observed a load; the number updated."""
    updated = 0
    for module in model.modules():
        if not isinstance(module, BiasBalanced) or module.observed_load is None:
            continue
        load = module.observed_load.detach().to(torch.float32)
        module.observed_load = None
        if ctx is not None and ctx.enabled:
            dist.all_reduce(load, op=dist.ReduceOp.SUM)
        with torch.no_grad():
            step = module.bias_update_rate * torch.sign(load.mean() - load)  # (n_experts,)
            module.selection_bias.add_(step.to(module.selection_bias.device, module.selection_bias.dtype))
        updated += 1
    return updated


__all__ = ["BiasBalanced", "balance_routers"]
