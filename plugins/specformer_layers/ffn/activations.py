"""The activations a spec can name for feed-forward networks."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specformer_layers.ffn.params import Activation


def _relu2(x: Tensor) -> Tensor:
    return torch.square(F.relu(x))  # squared ReLU (So et al. 2021, "Primer")


def _gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[Activation, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": _gelu_tanh,
    "relu": F.relu,
    "relu2": _relu2,
    "silu": F.silu,
}
