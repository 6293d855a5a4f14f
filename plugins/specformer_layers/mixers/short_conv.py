"""LFM2's gated short convolution: ``out(C * conv(B * x))``, a recurrent mixer whose state is a window of inputs."""

from __future__ import annotations


import torch
from torch import Tensor, nn

from specformer.model.state import StateSlots

from specformer_layers.mixers.conv import causal_conv, init_conv
from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer
from specformer_layers.mixers.short_conv_params import ShortConvParams


class ShortConv(RecurrentMixer):
    """LFM2's gated depthwise short convolution: :class:`ShortConvParams`.

    It has no heads (the gates and the convolution act on every channel at once), keeps no
    keys and reads no positions; its state is the last ``kernel - 1`` inputs of the
    convolution, ``(d_model, kernel - 1)`` per sequence.
    """

    Params = ShortConvParams

    def __init__(self, params: ShortConvParams | None = None, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        params = params if params is not None else ShortConvParams()
        self.layer_index = layer_index
        self.kernel = params.kernel
        self.state_slots = StateSlots((("conv", (d_model, params.kernel - 1)),))
        # Per token beyond the projections: the depthwise convolution and the two gating products.
        self.recurrent_flops_per_token = 2 * d_model * params.kernel + 2 * d_model
        # One matmul for the three streams; rows are [B (d_model); C (d_model); x (d_model)].
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=params.bias)
        self.conv_weight = nn.Parameter(torch.empty(d_model, params.kernel))  # (C, K): oldest input first
        self.conv_bias = nn.Parameter(torch.zeros(d_model)) if params.conv_bias else None
        self.out = nn.Linear(d_model, d_model, bias=params.bias)
        init_conv(self.conv_weight, self.conv_bias)

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The mixer on ``x`` ``(B, T, D)`` after the window ``state["conv"]`` ``(B, D, K-1)`` (zeros when None)."""
        b, c, v = self.in_proj(x).chunk(3, dim=-1)  # (B, T, D) each
        conv = causal_conv(b * v, self.conv_weight, self.conv_bias, window=None if state is None else state["conv"],
                           padding=padding, steps=steps)
        return MixerRun(out=self.out(c * conv.out), state={"conv": conv.window},
                        steps={"conv": conv.steps} if steps else None)

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel this layer runs, in words (``specformer summary``)."""
        return f"torch depthwise causal conv (kernel {self.kernel})"

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, conv_bias={self.conv_bias is not None}"

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.in_proj.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        init_conv(self.conv_weight, self.conv_bias)
        if self.conv_bias is not None:
            nn.init.zeros_(self.conv_bias)
        for bias in (self.in_proj.bias, self.out.bias):
            if bias is not None:
                nn.init.zeros_(bias)


__all__ = ["ShortConv"]
