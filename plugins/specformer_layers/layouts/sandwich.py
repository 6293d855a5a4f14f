"""Sandwich blocks (Gemma 2, Gemma 3, Gemma 4): a norm before and a norm after each sublayer."""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.residual import ResidualConnection
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

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        (a_mix, b_mix), (a_ffn, b_ffn) = self.add_scales
        h, mix = self.attention_residual.read(x)
        out = self.attention_post_norm(self.mixer(self.attention_norm(h), ctx))
        # One stream when a != 1 (checked): read gave x itself, so scaling the base is scaling the stream.
        x = self.attention_residual.write(x if a_mix == 1.0 else x * a_mix, out if b_mix == 1.0 else out * b_mix,
                                          mix=mix)
        h, mix = self.ffn_residual.read(x)
        ffn_in = h if self.ffn_norm is None else self.ffn_norm(h)
        out = self.ffn_post_norm(self.feed_forward(ffn_in, ctx))
        x = self.ffn_residual.write(x if a_ffn == 1.0 else x * a_ffn, out if b_ffn == 1.0 else out * b_ffn, mix=mix)
        if self.per_layer is not None:
            x = self.per_layer(x, ctx.per_layer_inputs[:, :, self.layer_index])  # this layer's slice (B, T, width)
        if self.layer_scale is not None:
            x = x * self.layer_scale
        return x

    def init_weights(self, *, std: float, residual_std: float) -> None:
        if self.layer_scale is not None:
            nn.init.ones_(self.layer_scale)
