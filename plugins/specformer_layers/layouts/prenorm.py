"""Pre-norm blocks (GPT-2, Llama): normalise each sublayer's input, add its output to the stream."""

from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.residual import ResidualConnection
from specformer_layers.layouts.base import Block
from specformer_layers.layouts.params import PreNormBlockParams


class PreNormBlock(Block):
    """Pre-norm block: each sublayer reads the normalised stream (:class:`PreNormBlockParams`)."""

    Params = PreNormBlockParams
    #: A shared block's ``output: mixer_input`` (``ctx.mixer_addend``) joins the mixer's input before its norm.
    accepts_mixer_addend = True

    def __init__(self, params: PreNormBlockParams | None = None, *, mixer: nn.Module, ffn: nn.Module,
                 make_norm: Callable[[], nn.Module],
                 make_residual: Callable[[], ResidualConnection] = ResidualConnection, d_model: int = 0) -> None:
        params = params if params is not None else PreNormBlockParams()
        super().__init__(params, mixer=mixer, ffn=ffn, make_norm=make_norm, make_residual=make_residual)
        if params.ffn_norm is not None and not isinstance(self.ffn_norm, nn.Identity):
            if d_model <= 0:
                raise ValueError("prenorm: ffn_norm needs the model width (d_model) to make the FFN's own norm")
            # The FFN's own kind, in the block norm's place (same name, same position in the state dict).
            self.ffn_norm = params.ffn_norm.make(dim=d_model)
        params.check_streams(max(self.attention_residual.n_streams, self.ffn_residual.n_streams))
        self.residual_multiplier = params.residual_multiplier
        self.normed_residual = params.normed_residual
        self.residual_scales = params.residual_scales
        self.output_scales = tuple(params.residual_multiplier * b for b in params.output_scales)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        (a_mix, a_ffn), (b_mix, b_ffn) = self.residual_scales, self.output_scales
        h, mix = self.attention_residual.read(x)
        addend = getattr(ctx, "mixer_addend", None)  # a bare call (ctx None) has none
        if addend is not None:  # Zamba: norm(x + shared(x)) feeds the mixer; the residual stays x
            h = h + addend
        if self.attention_norm is not None:  # None: mixer_pre_norm false, the mixer reads the raw stream
            h = self.attention_norm(h)
        out = self.mixer(h, ctx)
        # One stream (checked): read gave x itself, so writing onto another base is adding to that base.
        base = h if self.normed_residual else x
        if a_mix == 0.0:  # no residual (one stream, checked): the output is the stream, whatever x's width was
            x = out if b_mix == 1.0 else out * b_mix
        else:
            x = self.attention_residual.write(base if a_mix == 1.0 else base * a_mix,
                                              out if b_mix == 1.0 else out * b_mix, mix=mix)
        h, mix = self.ffn_residual.read(x)
        h = self.ffn_norm(h)
        out = self.feed_forward(h, ctx)
        base = h if self.normed_residual else x
        if a_ffn == 0.0:
            return out if b_ffn == 1.0 else out * b_ffn
        return self.ffn_residual.write(base if a_ffn == 1.0 else base * a_ffn, out if b_ffn == 1.0 else out * b_ffn,
                                       mix=mix)
