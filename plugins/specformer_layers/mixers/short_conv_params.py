"""The settings of LFM2's gated short convolution, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field

from specformer.registry.params import Params, Sized
from specformer.model.sized import linear
from specformer_layers.mixers.conv_params import ConvTaps


class ShortConvParams(Params):
    """LFM2's gated short convolution: a depthwise causal convolution over the last ``kernel`` tokens, gated twice.

    The input is projected to three streams ``B``, ``C`` and ``x`` (one ``in_proj``, rows in
    that order as LFM2's checkpoints keep them); each channel of ``B * x`` is convolved over its
    last ``kernel`` tokens (its own weights, no mixing across channels), the result is gated by
    ``C`` and projected back: ``out(C * conv(B * x))`` (Liquid AI, LFM2, arXiv:2511.23404). It
    reads no positions and keeps only the last ``kernel - 1`` inputs of each channel between
    forward passes, so its generation cache is ``d_model * (kernel - 1)`` values per sequence,
    whatever the context. LFM2 places these layers between a few softmax attention layers
    (``layers:`` overrides); its ``conv_L_cache`` is ``kernel``, and its ``conv_bias`` switches
    both ``bias`` and ``conv_bias``.
    """

    kernel: ConvTaps = Field(default=3, description="Tokens each channel's convolution spans (LFM2's conv_L_cache), at least 2.")
    bias: bool = Field(default=False, description="Biases on the input and output projections.")
    conv_bias: bool = Field(default=False, description="A bias per channel on the convolution.")

    def sized(self, *, d_model: int) -> Sized:
        K = self.kernel
        parameters = (linear(d_model, 3 * d_model, bias=self.bias) + d_model * K + (d_model if self.conv_bias else 0)
                      + linear(d_model, d_model, bias=self.bias))
        return Sized(parameters=parameters, keeps_state=True)


__all__ = ["ShortConvParams"]
