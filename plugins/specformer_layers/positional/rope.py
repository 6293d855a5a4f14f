"""Rotary position embeddings (Su et al. 2021)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specformer.model.positional import PositionalScheme
from specformer_layers.positional.fp32 import Float32Tables
from specformer_layers.positional.params import RotaryPositionsParams, rotary_dim_of
from specformer_layers.positional.rope_scaling.base import default_inv_freq


class RotaryPositions(PositionalScheme, Float32Tables):
    """Rotary position embeddings, optionally scaled for long contexts: :class:`RotaryPositionsParams`."""

    Params = RotaryPositionsParams

    def __init__(self, params: RotaryPositionsParams | None = None, *, head_dim: int, context_length: int) -> None:
        params = params if params is not None else RotaryPositionsParams()
        super().__init__()
        rotary_dim = rotary_dim_of(head_dim, params.fraction)
        theta = params.theta
        scaling = None
        if params.scaling is not None:
            scaling = params.scaling.make(rotary_dim=rotary_dim, theta=theta, context_length=context_length)
        if scaling is not None and scaling.rotary_dim != rotary_dim:
            raise ValueError(f"rope scaling was built for rotary_dim {scaling.rotary_dim}, the rope rotates {rotary_dim}")
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.interleaved = params.interleaved
        self.scaling = scaling
        self.attention_scaling = scaling.attention_scaling if scaling is not None else 1.0
        # Past context_length: dynamic scaling keeps adapting; any other rope runs, with a warning.
        self.extrapolates = "yes" if scaling is not None and scaling.keeps_adapting else "warn"
        self.restart_cache_at = scaling.restart_cache_at if scaling is not None else None
        if scaling is None:
            self.register_table("inv_freq", default_inv_freq(rotary_dim, theta))

    def frequencies(self, positions: Tensor) -> Tensor:
        """The inverse frequencies ``(rotary_dim / 2,)`` for a forward over ``positions``."""
        if self.scaling is None:
            return self.inv_freq
        if self.scaling.length_dependent:
            return self.scaling.frequencies(positions.max() + 1)
        return self.scaling.frequencies(None)

    def prepare(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """``(cos, signed_sin)``, each ``(B, 1, T, rotary_dim)``, laid out channel by channel.

        Pair ``(a, b)`` turns into ``(a cos - b sin, b cos + a sin)``, i.e.
        ``x * cos + swap(x) * signed_sin`` with ``signed_sin = -sin`` on each pair's first
        channel: two multiplies per rotation instead of four, tables built once per forward.
        """
        # In fp32 whatever the model dtype: angles of large positions lose precision in bf16.
        angles = positions.float()[..., None] * self.frequencies(positions)  # (B, T, rotary_dim/2)
        cos, sin = angles.cos(), angles.sin()
        if self.attention_scaling != 1.0:
            cos, sin = cos * self.attention_scaling, sin * self.attention_scaling
        if self.interleaved:  # channels (a0, b0, a1, b1, ...)
            cos = cos.repeat_interleave(2, dim=-1)
            sin = torch.stack((-sin, sin), dim=-1).flatten(-2)
        else:  # channels (a0, a1, ..., b0, b1, ...)
            cos = torch.cat((cos, cos), dim=-1)
            sin = torch.cat((-sin, sin), dim=-1)
        return cos[:, None], sin[:, None]  # (B, 1, T, rotary_dim) each

    def rotate(self, x: Tensor, state: Any) -> Tensor:
        cos, signed_sin = state
        if cos.dtype != x.dtype:  # checked first: a decode step calls this twice per layer, each op counts
            cos, signed_sin = cos.to(x.dtype), signed_sin.to(x.dtype)
        whole = self.rotary_dim == x.shape[-1]
        rot = x if whole else x[..., : self.rotary_dim]
        if self.interleaved:
            swapped = rot.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (b0, a0, b1, a1, ...)
        else:
            a, b = rot.chunk(2, dim=-1)  # (B, H, T, rotary_dim/2) each
            swapped = torch.cat((b, a), dim=-1)
        rotated = rot * cos + swapped * signed_sin
        return rotated if whole else torch.cat((rotated, x[..., self.rotary_dim :]), dim=-1)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, theta={self.theta}, interleaved={self.interleaved}"
