"""The short causal convolution in front of every recurrent mixer, with the window it carries.

Gated DeltaNet, Kimi Delta Attention, Mamba-2 and LFM2's short convolution all mix each
channel over its last ``K`` inputs (a depthwise convolution, ``K`` of 2 to 4). Between
forward passes the layer keeps the last ``K - 1`` inputs of each channel, its *window*
``(B, C, K - 1)``, oldest first (as transformers and ``causal-conv1d`` keep it).

Padding never enters the window: a cached forward's rows may open with padding (negative
positions); those columns are moved in front of the window before convolving, so each row
sees exactly its window followed by its real tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class ConvOutput:
    """What :func:`causal_conv` returns."""

    out: Tensor  # (B, T, C): the convolved inputs (activation applied); rows' padding columns are undefined
    window: Tensor  # (B, C, K-1): the last K-1 real inputs of each row, to carry into the next forward
    steps: Tensor | None = None  # (B, T, C, K-1): the window after each token, when asked for


#: Up to this many tokens the convolution is written as K shifted multiply-adds: on CPU, torch's depthwise
#: conv1d (oneDNN) spends milliseconds per call setting up, far more than the arithmetic of a decode step.
SHIFTED_UP_TO = 32


def causal_conv(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, window: Tensor | None = None,
                padding: Tensor | None = None, activation: str | None = None, steps: bool = False) -> ConvOutput:
    """Depthwise causal convolution of ``x`` ``(B, T, C)`` by ``weight`` ``(C, K)`` (``bias`` ``(C,)``).

    ``window`` ``(B, C, K-1)``: the inputs before ``x`` (zeros when None: a fresh sequence).
    ``padding`` ``(B,)``: how many columns open each row as padding (they are kept out of the
    window). ``activation``: ``"silu"`` or None, applied to the output. ``steps``: also
    return the window after every token (a padding token's is the window before the row).
    """
    batch, length, channels = x.shape
    kernel = weight.shape[-1]
    if window is None:
        window = x.new_zeros((batch, channels, kernel - 1))
    stream = torch.cat((window.to(x.dtype), x.transpose(1, 2)), dim=2)  # (B, C, K-1+T): window, then the tokens
    if padding is not None:
        stream = _padding_first(stream, padding, kernel - 1)
    if length <= SHIFTED_UP_TO:
        out = _shifted_sum(stream, weight, bias, length)  # (B, C, T)
    else:
        out = F.conv1d(stream, weight.unsqueeze(1), bias, groups=channels)  # (B, C, T)
    if activation == "silu":
        out = F.silu(out)
    elif activation is not None:
        raise ValueError(f"causal_conv knows the activations 'silu' and None, got {activation!r}")
    result = ConvOutput(out=out.transpose(1, 2), window=stream[:, :, stream.shape[2] - (kernel - 1):])
    if steps:
        # After token t the window is the K-1 inputs ending at t: stream[t + 1 : t + K].
        after = stream.unfold(2, kernel - 1, 1)[:, :, 1:]  # (B, C, T, K-1)
        if padding is not None:
            before = window.to(x.dtype)[:, :, None, :].expand_as(after)
            is_padding = torch.arange(length, device=x.device)[None, :] < padding[:, None]  # (B, T)
            after = torch.where(is_padding[:, None, :, None], before, after)
        result.steps = after.permute(0, 2, 1, 3)  # (B, T, C, K-1)
    return result


def _shifted_sum(stream: Tensor, weight: Tensor, bias: Tensor | None, length: int) -> Tensor:
    """The depthwise convolution of ``stream`` ``(B, C, K-1+T)`` as ``sum_j weight[:, j] * stream[:, :, j:j+T]``."""
    kernel = weight.shape[-1]
    out = stream[:, :, 0:length] * weight[:, 0:1]  # (B, C, T)
    for j in range(1, kernel):
        out = out + stream[:, :, j:j + length] * weight[:, j:j + 1]
    return out if bias is None else out + bias[:, None]


def _padding_first(stream: Tensor, padding: Tensor, kept: int) -> Tensor:
    """``stream`` ``(B, C, kept + T)`` with each row's padding columns moved in front of its window (as zeros)."""
    total = stream.shape[2]
    index = torch.arange(total, device=stream.device)[None, :]  # (1, kept+T)
    pad = padding[:, None]  # (B, 1)
    # New column i: zero below the row's padding, then the window, then the row's real tokens in place.
    source = torch.where(index < pad + kept, index - pad, index)  # (B, kept+T)
    source = torch.where(index < pad, total, source)  # ``total``: the zero column appended below
    padded = torch.cat((stream, stream.new_zeros(stream.shape[0], stream.shape[1], 1)), dim=2)
    return padded.gather(2, source[:, None, :].expand(-1, stream.shape[1], -1))


@torch.no_grad()
def init_conv(weight: Tensor, bias: Tensor | None) -> None:
    """A depthwise convolution's ``weight`` ``(C, K)`` and ``bias`` ``(C,)`` as torch initialises a depthwise
    ``Conv1d`` (what the published mixers train from): uniform within ``1/sqrt(K)``, its fan-in."""
    bound = 1.0 / math.sqrt(weight.shape[1])
    nn.init.uniform_(weight, -bound, bound)
    if bias is not None:
        nn.init.uniform_(bias, -bound, bound)


__all__ = ["ConvOutput", "causal_conv", "init_conv"]
