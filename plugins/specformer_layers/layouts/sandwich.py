"""Sandwich blocks (Gemma 2, Gemma 3, Gemma 4): a norm before and a norm after each sublayer."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.residual import ResidualConnection
from specformer_layers.layouts.absent import is_absent
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import SandwichBlockParams
from specformer_layers.layouts.per_layer_gate import PerLayerGate


class SandwichBlock(Block):
    """Sandwich block: a norm before and after each sublayer (:class:`SandwichBlockParams`)."""

    Params = SandwichBlockParams

    def __init__(self, params: SandwichBlockParams | None = None, *, mixer: nn.Module, ffn: nn.Module,
                 make_norm: Callable[[], nn.Module],
                 make_residual: Callable[[], ResidualConnection] = ResidualConnection, d_model: int = 0,
                 layer_index: int = 0, per_layer_input: int = 0) -> None:
        params = params if params is not None else SandwichBlockParams()
        super().__init__(params, mixer=mixer, ffn=ffn, make_norm=make_norm, make_residual=make_residual)
        streams = max(self.attention_residual.n_streams, self.ffn_residual.n_streams)
        params.check_single_stream(streams, per_layer_input=per_layer_input)
        self.layer_index = layer_index
        self.per_layer_activation = params.per_layer_activation
        # The width of the per-layer input this block reads from ctx (0: none), a fact the builder checks.
        self.per_layer_width = per_layer_input
        self.per_layer = (PerLayerGate(d_model=d_model, width=per_layer_input, activation=params.per_layer_activation,
                                       norm=make_norm()) if per_layer_input else None)
        self.layer_scale = nn.Buffer(torch.ones(1)) if params.layer_scale else None
        self.residual_multiplier = params.residual_multiplier
        # (a, b) of each add a x + b out: (1, residual_multiplier) unless depth-scaled by this layer's index (Beam).
        self.add_scales = params.depth_scales(layer_index)
        # Ergo: a learned per-channel weight on each add (zeros: out / 2 + x sqrt(3) / 2); an absent sublayer has none.
        gates = [(name, not is_absent(part)) for name, part in (("attention_residual_gate", mixer),
                                                                ("ffn_residual_gate", ffn))]
        if params.residual_gate and d_model <= 0:
            raise ValueError("sandwich residual_gate needs the model width (d_model) to size its gates")
        for name, present in gates:
            setattr(self, name, nn.Parameter(torch.zeros(d_model)) if params.residual_gate and present else None)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        (a_mix, b_mix), (a_ffn, b_ffn) = self.add_scales
        h, mix = self.attention_residual.read(x)
        out = self.attention_post_norm(self.mixer(self.attention_norm(h), ctx))
        x = self._join(self.attention_residual, self.attention_residual_gate, x, out, a_mix, b_mix, mix)
        h, mix = self.ffn_residual.read(x)
        ffn_in = h if self.ffn_norm is None else self.ffn_norm(h)
        out = self.ffn_post_norm(self.feed_forward(ffn_in, ctx))
        x = self._join(self.ffn_residual, self.ffn_residual_gate, x, out, a_ffn, b_ffn, mix)
        return self._after_sublayers(x, ctx)

    @staticmethod
    def _join(conn: ResidualConnection, gate: Tensor | None, x: Tensor, out: Tensor, a: float, b: float,
              mix: object) -> Tensor:
        """The stream after one sublayer's add: ``a x + b out`` through the connection, or Ergo's gated add."""
        out = out if b == 1.0 else out * b
        if gate is not None:  # one stream (checked): the connection would add out to x itself
            return _gated_add(x, out, gate)
        # One stream when a != 1 (checked): read gave x itself, so scaling the base is scaling the stream.
        return conn.write(x if a == 1.0 else x * a, out, mix=mix)

    def _after_sublayers(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        if self.per_layer is not None:
            x = self.per_layer(x, ctx.per_layer_inputs[:, :, self.layer_index])  # this layer's slice (B, T, width)
        if self.layer_scale is not None:
            x = x * self.layer_scale
        return x

    def init_weights(self, *, std: float, residual_std: float) -> None:
        if self.layer_scale is not None:
            nn.init.ones_(self.layer_scale)
        for gate in (self.attention_residual_gate, self.ffn_residual_gate):
            if gate is not None:
                nn.init.zeros_(gate)


def _gated_add(x: Tensor, out: Tensor, w: Tensor) -> Tensor:
    """``sigmoid(w) out + sqrt(1 + sigmoid(w)) exp(-softplus(w) / 2) x``, the gates in float32 at least (Ergo)."""
    w = w.to(torch.promote_types(w.dtype, torch.float32))
    branch = torch.sigmoid(w)
    keep = torch.sqrt(1.0 + branch) * torch.exp(-0.5 * F.softplus(w))
    return (branch * out + keep * x).to(x.dtype)
