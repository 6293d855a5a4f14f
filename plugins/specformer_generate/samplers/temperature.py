"""Temperature: sharpen or flatten the next-token distribution."""

from __future__ import annotations

import torch
from torch import Tensor

from specformer_generate.samplers.params import TemperatureParams


class Temperature:
    """Divide the logits by ``value``: ``softmax(z / T)``.

    Its settings and the rule in full: :class:`TemperatureParams`.
    """

    Params = TemperatureParams

    def __init__(self, params: TemperatureParams) -> None:
        self.value = float(params.value)

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        largest = torch.finfo(logits.dtype).max
        scaled = (logits / self.value).clamp(-largest, largest)  # +-inf from overflow would make NaN later
        return torch.where(torch.isneginf(logits), logits, scaled)  # filtered stays filtered

    def __repr__(self) -> str:
        return f"temperature(value={self.value})"
