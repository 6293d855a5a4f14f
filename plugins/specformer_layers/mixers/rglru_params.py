"""The settings of Griffin's recurrent block (the RG-LRU), importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized
from specformer.model.sized import linear
from specformer_layers.ffn.params import Activation
from specformer_layers.mixers.conv_params import ConvTaps


class RGLRUParams(Params):
    """Griffin's recurrent block around the Real-Gated Linear Recurrent Unit (De et al. 2024, "Griffin",
    arXiv:2402.19427; RecurrentGemma).

    Two projections of the input, ``width`` channels each: ``y`` through ``activation`` (GeLU, the
    gate branch) and ``x`` through a short depthwise causal convolution (``conv_kernel`` taps). Per
    token and channel the RG-LRU computes an input gate ``i`` and a recurrence gate ``r`` (sigmoids
    of block-diagonal linear maps of ``x``: ``gate_blocks`` blocks of ``width / gate_blocks``
    channels), the decay ``a = sigmoid(Λ)^(c r)`` with ``c = 8`` and a learned ``Λ`` per channel
    (kept as ``a_param = -Λ``: ``a = exp(-8 r softplus(a_param))``, RecurrentGemma's
    ``recurrent_param``), and the state ``h = a h + sqrt(1 - a²) (i x)``; a sequence's first token
    resets it: ``h = i x``. The output is ``out(y * h)``. Prefill composes the recurrence ``chunk``
    tokens at a time; what a sequence keeps is fixed: the convolution's last ``conv_kernel - 1``
    inputs, the ``width`` states and whether the sequence has begun.
    """

    width: int = Field(gt=0, description="Channels of the recurrence (RecurrentGemma's lru_width).")
    gate_blocks: int = Field(default=1, gt=0, description="Diagonal blocks of the two gates' weights (RecurrentGemma's num_attention_heads); must divide width.")
    conv_kernel: ConvTaps = Field(default=4, description="Taps of the short causal convolution over x (at least 2; RecurrentGemma's conv1d_width).")
    activation: Activation = Field(default="gelu_tanh", description="Non-linearity of the y branch (RecurrentGemma's hidden_activation).")
    bias: bool = Field(default=True, description="Biases on the projections and the convolution (the gates always have theirs).")
    chunk: int = Field(default=64, gt=0, description="Tokens per chunk of the parallel recurrence (speed and memory only).")

    @model_validator(mode="after")
    def _blocks_divide_width(self) -> "RGLRUParams":
        if self.width % self.gate_blocks:
            raise ValueError(f"gate_blocks ({self.gate_blocks}) must divide width ({self.width})")
        return self

    def sized(self, *, d_model: int) -> Sized:
        W, K, G = self.width, self.conv_kernel, self.gate_blocks
        block = W // G
        parameters = (2 * linear(d_model, W, bias=self.bias)  # x and y
                      + W * K + (W if self.bias else 0)  # the depthwise convolution
                      + 2 * (G * block * block + W)  # the input and recurrence gates, with their biases
                      + W  # a_param
                      + linear(W, d_model, bias=self.bias))
        return Sized(parameters=parameters, keeps_state=True)  # no heads: nothing per token, no positions


__all__ = ["RGLRUParams"]
