"""What a RoPE scaling gives the rotary scheme: frequencies and an attention factor."""

from __future__ import annotations

from torch import Tensor

from specformer_layers.positional.fp32 import Float32Tables, rope_exponents
from specformer_layers.positional.rope_scaling.params import check_rotary_dim


class RopeScaling(Float32Tables):
    """Base class of the ``rope_scaling`` kind.

    ``frequencies(seq_len)`` returns the inverse frequencies ``(rotary_dim / 2,)`` in
    float32 for a forward pass whose longest position is ``seq_len - 1``; schemes whose
    frequencies do not depend on the length (``length_dependent = False``) ignore it and
    are called with ``None``. ``attention_scaling`` multiplies cos and sin, so attention
    scores grow by its square (YaRN's temperature, LongRoPE's factor).
    """

    #: True when the frequencies change with the length of the forward pass (dynamic NTK, LongRoPE).
    length_dependent: bool = False
    #: True when the scaling keeps adapting to any length (dynamic NTK): generation past
    #: context_length runs without a warning.
    keeps_adapting: bool = False
    #: Columns after which keys cached before are stale (LongRoPE's switch); None: never.
    restart_cache_at: int | None = None

    def __init__(self, *, rotary_dim: int, theta: float, attention_scaling: float = 1.0) -> None:
        super().__init__()
        check_rotary_dim(rotary_dim)
        self.rotary_dim = rotary_dim
        self.theta = theta
        self.attention_scaling = float(attention_scaling)

    def frequencies(self, seq_len: Tensor | None) -> Tensor:
        return self.inv_freq

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, theta={self.theta}, attention_scaling={self.attention_scaling:g}"


def default_inv_freq(rotary_dim: int, theta: float) -> Tensor:
    """RoPE's frequencies ``theta^(-2i / rotary_dim)`` (float32, on the CPU)."""
    return 1.0 / (theta ** rope_exponents(rotary_dim))

