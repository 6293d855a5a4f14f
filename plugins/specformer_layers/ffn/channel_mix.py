"""RWKV's channel mixing: token shift, squared-ReLU key, sigmoid receptance gate (:class:`ChannelMixParams`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.state import StateSlots

from specformer_layers.ffn.params import ChannelMixParams
from specformer_layers.mixers.documents import by_document, leading_padding
from specformer_layers.mixers.recurrent import with_state
from specformer_layers.mixers.token_shift import token_shift


class ChannelMix(nn.Module):
    """RWKV's feed-forward (:class:`ChannelMixParams`).

    Parameters, by name (transformers' names): ``time_mix_key`` and ``time_mix_receptance``
    ``(D,)``, ``key`` (Linear ``D -> hidden``), ``value`` (Linear ``hidden -> D``) and
    ``receptance`` (Linear ``D -> D``), no biases.

    It reads the forward context (``reads_context``): packed documents each start a fresh
    shift, and a row's leading padding (negative positions) is skipped. Per sequence it keeps
    ``shift`` ``(D,)``, the previous token's input: its :attr:`state_slots`, which a cache keeps
    beside its layer's mixer state (as ``ffn.shift``: :func:`specformer.model.state.layer_state_slots`).
    """

    Params = ChannelMixParams
    reads_context = True

    def __init__(self, params: ChannelMixParams | None = None, *, d_model: int, layer_index: int = 0) -> None:
        params = params if params is not None else ChannelMixParams()
        super().__init__()
        hidden = params.hidden_for(d_model)
        # The public facts a cache reads (specformer.model.state): its layer and its state.
        self.layer_index = layer_index
        self.state_slots = StateSlots((("shift", (d_model,)),))
        self.time_mix_key = nn.Parameter(torch.empty(d_model))
        self.time_mix_receptance = nn.Parameter(torch.empty(d_model))
        self.key = nn.Linear(d_model, hidden, bias=False)
        self.receptance = nn.Linear(d_model, d_model, bias=False)
        self.value = nn.Linear(hidden, d_model, bias=False)
        self._init_time()

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        if ctx.document_ids is not None:  # packed documents: each starts with no previous token
            return by_document(x, ctx.document_ids, lambda documents: self.mix(documents))
        if ctx.cache is None:
            return self.mix(x, padding=None if ctx.plain_causal else leading_padding(ctx.positions))

        def cached(before: dict[str, Tensor], keep_steps: bool) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor] | None]:
            shifted, after, steps = token_shift(x, before["shift"], leading_padding(ctx.positions))
            return self.mixed(x, shifted), {"shift": after}, {"shift": steps} if keep_steps else None

        return with_state(ctx, self, cached, part="ffn")

    def mix(self, x: Tensor, *, padding: Tensor | None = None) -> Tensor:
        """The channel mixing of fresh rows ``x`` ``(B, T, D)`` whose first ``padding`` ``(B,)`` tokens are padding."""
        shifted, _, _ = token_shift(x, None, padding)
        return self.mixed(x, shifted)

    def mixed(self, x: Tensor, shifted: Tensor) -> Tensor:
        """The channel mixing of ``x`` ``(B, T, D)`` given each token's previous input ``shifted`` (same shape)."""
        k = torch.relu(self.key(torch.lerp(shifted, x, self.time_mix_key))).square()  # (B, T, hidden)
        r = torch.sigmoid(self.receptance(torch.lerp(shifted, x, self.time_mix_receptance)))
        return r * self.value(k)

    def extra_repr(self) -> str:
        return f"hidden={self.key.out_features}"

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.normal_(self.key.weight, std=std)
        nn.init.normal_(self.receptance.weight, std=std)
        nn.init.normal_(self.value.weight, std=residual_std)  # feeds the residual stream
        self._init_time()

    @torch.no_grad()
    def _init_time(self) -> None:
        """Token-shift weights rising over the channels (RWKV-LM's ``RWKV_ChannelMix`` init, half way down the stack)."""
        fraction = torch.arange(self.time_mix_key.shape[0], dtype=torch.float32) / self.time_mix_key.shape[0]
        self.time_mix_key.copy_(fraction ** 0.5)
        self.time_mix_receptance.copy_(fraction ** 0.5)


__all__ = ["ChannelMix"]
