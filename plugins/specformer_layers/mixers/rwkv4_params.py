"""The settings of RWKV-4's time mixing, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field

from specformer.registry.params import Params, Sized
from specformer.model.sized import linear


class Rwkv4Params(Params):
    """RWKV-4's time mixing (Peng et al. 2023, "RWKV: Reinventing RNNs for the Transformer Era",
    arXiv:2305.13048; transformers' RwkvSelfAttention).

    Each token's input ``x`` is interpolated with the previous token's (the token shift, per
    channel: ``x * mu + x_prev * (1 - mu)``, one ``mu`` each for the key, the value and the
    receptance) before three projections to ``width`` channels: ``k``, ``v`` and the receptance
    ``r``. Per channel, the WKV recurrence averages the values seen so far with weights that
    decay by ``w = exp(time_decay)`` per token (the decay factor ``exp(-w)``) and favours the
    current token by the bonus ``u = time_first``::

        wkv_t = (sum_{i<t} e^{-(t-1-i) w + k_i} v_i + e^{u + k_t} v_t)
              / (sum_{i<t} e^{-(t-1-i) w + k_i}     + e^{u + k_t})

    computed, as the reference does, from a running numerator and denominator kept relative to
    their largest exponent (no overflow whatever the keys). The output is
    ``output(sigmoid(r) * wkv)``. What a sequence keeps is fixed: the previous token's input
    (``d_model``) and the numerator, denominator and exponent (``width`` each).
    """

    width: int | None = Field(default=None, gt=0, description="Channels of k, v, r and the recurrence (RWKV's attention_hidden_size); none: d_model.")

    def sized(self, *, d_model: int) -> Sized:
        W = self.width if self.width is not None else d_model
        parameters = (3 * d_model  # the token-shift interpolations of k, v and r
                      + 2 * W  # time_decay and time_first
                      + 3 * linear(d_model, W, bias=False)  # key, value, receptance
                      + linear(W, d_model, bias=False))
        return Sized(parameters=parameters, keeps_state=True)  # no heads: nothing per token, no positions


__all__ = ["Rwkv4Params"]
