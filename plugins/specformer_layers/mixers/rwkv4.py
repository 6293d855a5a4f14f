"""RWKV-4's time mixing: token shift, the WKV recurrence, the receptance gate (:class:`Rwkv4Params`)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from specformer.model.state import StateSlots

from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer
from specformer_layers.mixers.rwkv4_params import Rwkv4Params
from specformer_layers.mixers.token_shift import token_shift
from specformer_layers.mixers.wkv import CHUNK, WKVState, wkv, wkv_chunked

#: A cached forward of at most this many tokens runs token by token (decoding); longer ones by chunks.
RECURRENT_MAX_TOKENS = 16
#: Devices whose prefill runs token by token all the same: on a CPU the chunked form's (C, C) weights per channel cost
#: more than the sequential steps they save (2.5x to 30x slower for chunks of 4 to 64; docs/benchmarks.md).
LOOP_DEVICES = frozenset({"cpu"})


class Rwkv4(RecurrentMixer):
    """RWKV-4's time mixing (:class:`Rwkv4Params`), written for the model's mixer slot.

    Parameters, by name (weight conversions rely on them; transformers' names): ``time_mix_key``,
    ``time_mix_value``, ``time_mix_receptance`` ``(D,)``, ``time_decay`` and ``time_first``
    ``(W,)``, ``key``, ``value``, ``receptance`` (Linear ``D -> W``, no bias) and ``output``
    (Linear ``W -> D``, no bias).

    It has no heads, keeps nothing per token and reads no positions. Per sequence it keeps
    ``shift`` ``(D,)`` (the previous token's input) and the WKV state ``num``, ``den`` and
    ``exponent`` ``(W,)`` (:mod:`specformer_layers.mixers.wkv`): its :attr:`state_slots`.
    """

    Params = Rwkv4Params

    def __init__(self, params: Rwkv4Params, *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        width = params.width if params.width is not None else d_model
        self.width = width
        # The public facts others read (specformer.model.state): its layer and its state.
        self.layer_index = layer_index
        # Per token and channel beyond the projections: the two maxima, four exponentials, the
        # numerator's and denominator's products and sums twice, the division and the gate.
        self.recurrent_flops_per_token = 20 * width + 6 * d_model
        self.state_slots = StateSlots((("shift", (d_model,)), ("num", (width,)), ("den", (width,)),
                                       ("exponent", (width,))))
        self.time_mix_key = nn.Parameter(torch.empty(d_model))
        self.time_mix_value = nn.Parameter(torch.empty(d_model))
        self.time_mix_receptance = nn.Parameter(torch.empty(d_model))
        self.time_decay = nn.Parameter(torch.empty(width))
        self.time_first = nn.Parameter(torch.empty(width))
        self.key = nn.Linear(d_model, width, bias=False)
        self.value = nn.Linear(d_model, width, bias=False)
        self.receptance = nn.Linear(d_model, width, bias=False)
        self.output = nn.Linear(width, d_model, bias=False)
        self._init_time()

    # -- forward -----------------------------------------------------------------------------------

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """Time mixing on ``x`` ``(B, T, D)`` from ``state`` (None: fresh rows); output, state after, steps if asked.

        The WKV runs by chunks of :data:`~specformer_layers.mixers.wkv.CHUNK` tokens
        (:func:`~specformer_layers.mixers.wkv.wkv_chunked`: prefill, training), token by token
        (:func:`~specformer_layers.mixers.wkv.wkv`) for a cached forward of at most
        :data:`RECURRENT_MAX_TOKENS` tokens (decoding) and whenever the state after each token is kept.
        """
        length = x.shape[1]
        recurrent = (steps or x.device.type in LOOP_DEVICES
                     or (state is not None and length <= RECURRENT_MAX_TOKENS))
        shifted, shift_after, shift_steps = token_shift(x, None if state is None else state["shift"], padding)
        k = self.key(torch.lerp(shifted, x, self.time_mix_key))  # x mu + shifted (1 - mu); (B, T, W)
        v = self.value(torch.lerp(shifted, x, self.time_mix_value))
        r = torch.sigmoid(self.receptance(torch.lerp(shifted, x, self.time_mix_receptance)))
        real = None if padding is None else torch.arange(length, device=x.device)[None, :] >= padding[:, None]  # (B, T)
        before = None if state is None else WKVState(state["num"], state["den"], state["exponent"])
        decay = torch.exp(self.time_decay)
        if recurrent:
            out, after, per_token = wkv(k, v, decay=decay, bonus=self.time_first, state=before, real=real, steps=steps)
        else:
            (out, after), per_token = wkv_chunked(k, v, decay=decay, bonus=self.time_first, state=before, real=real), None
        return MixerRun(out=self.output(r * out.to(x.dtype)),
                        state={"shift": shift_after, "num": after.num, "den": after.den, "exponent": after.exponent},
                        steps=None if per_token is None else {"shift": shift_steps, "num": per_token.num,
                                                               "den": per_token.den, "exponent": per_token.exponent})

    # -- description and initialisation -----------------------------------------------------------

    def describe_kernel(self, *, bias: bool = False) -> str:
        """What runs, in words (``specformer summary``)."""
        return (f"torch WKV token by token on a CPU; elsewhere by chunks (chunk {CHUNK}, max-stabilised numerator and "
                f"denominator), token by token for cached forwards of <= {RECURRENT_MAX_TOKENS} tokens")

    def extra_repr(self) -> str:
        return f"width={self.width}"

    def init_weights(self, *, std: float, residual_std: float) -> None:
        for linear in (self.key, self.value, self.receptance):
            nn.init.normal_(linear.weight, std=std)
        nn.init.normal_(self.output.weight, std=residual_std)  # feeds the residual stream
        self._init_time()

    @torch.no_grad()
    def _init_time(self) -> None:
        """RWKV-4's shape of the time parameters, for a layer half way down the stack (the mixer does not know its depth).

        Decay rates spread from fast to slow over the channels, a zigzag bonus around log(0.3),
        and token-shift weights rising over the channels (RWKV-LM's ``RWKV_TimeMix`` init).
        """
        width, d_model = self.width, self.time_mix_key.shape[0]
        ratio = 0.5
        channel = torch.arange(width, dtype=torch.float32) / max(width - 1, 1)
        self.time_decay.copy_(-5 + 8 * channel ** (0.7 + 1.3 * ratio))
        zigzag = ((torch.arange(width) + 1) % 3 - 1).float() * 0.5
        self.time_first.copy_(torch.full((width,), 0.3).log() + zigzag)
        fraction = torch.arange(d_model, dtype=torch.float32) / d_model
        self.time_mix_key.copy_(fraction ** ratio)
        self.time_mix_value.copy_(fraction ** ratio + 0.3 * ratio)
        self.time_mix_receptance.copy_(fraction ** (0.5 * ratio))


__all__ = ["Rwkv4"]
