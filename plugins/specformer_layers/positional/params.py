"""The settings of the positional schemes, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specformer.registry.params import Params, Sized, SubComponent


class LearnedPositionsParams(Params):
    """A trained vector per position, added to the token embeddings (GPT-2, Radford et al. 2019).

    ``offset`` rows come before position 0's and are never read: OPT's table starts its
    positions at row 2 (rows kept so that its checkpoints load as they are).
    """

    offset: int = Field(default=0, ge=0, description="Table rows before position 0's, never read (OPT: 2).")

    def sized(self, *, context_length: int, d_model: int) -> Sized:
        return Sized(parameters=(context_length + self.offset) * d_model, adds_to_embeddings=True)


class SinusoidalPositionsParams(Params):
    """sin/cos of the position at geometrically spaced frequencies, added to the embeddings.

    ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(p / base^(2i/d))``.
    Computed from the positions on every forward, so it has no length limit.

    The variants of tensor2tensor and fairseq (XGLM) are flags: ``split_halves`` puts every
    sine first and every cosine after them (``PE[p, i] = sin``, ``PE[p, d/2 + i] = cos``);
    ``frequencies: half_minus_one`` spaces them as ``base^(-i/(d/2 - 1))``, so that the
    last pair turns at exactly ``1/base``; ``offset`` encodes position ``p`` as ``p + offset``
    (fairseq's table starts its positions after the padding index: XGLM's ``offset`` 2).
    """

    base: float = Field(default=10000.0, gt=1, description="The wavelength base (10000 in the paper).")
    offset: int = Field(default=0, ge=0, description="Added to every position before it is encoded (XGLM: 2).")
    split_halves: bool = Field(default=False, description="Every sine, then every cosine (tensor2tensor, fairseq) "
                                                          "instead of sin/cos interleaved (the paper).")
    frequencies: Literal["d_model", "half_minus_one"] = Field(
        default="d_model", description="d_model: pair i turns at base^(-2i/d) (the paper); half_minus_one: at "
                                       "base^(-i/(d/2 - 1)) (tensor2tensor, fairseq).")

    def sized(self, *, d_model: int) -> Sized:
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
        if self.frequencies == "half_minus_one" and d_model < 4:
            raise ValueError(f"sinusoidal frequencies half_minus_one need d_model of at least 4, got {d_model}")
        return Sized(parameters=0, adds_to_embeddings=True)


class RotaryPositionsParams(Params):
    """Rotate each pair of query/key channels by an angle proportional to the position.

    Channel pair ``i`` turns by ``position * theta^(-2i/rotary_dim)``, so the score of a
    query and a key depends on their distance only. ``fraction`` < 1 rotates only the
    first channels of each head (GPT-NeoX, Phi); ``interleaved`` pairs channels (0,1),
    (2,3)... as in the original paper and GPT-J instead of the half-split pairing (i,
    i + d/2) of GPT-NeoX and Llama. ``scaling`` (a ``rope_scaling`` component: linear,
    dynamic, yarn, llama3, longrope) changes the frequencies for longer contexts.

    Frequencies stay float32 when the model is cast to bfloat16, and angles are computed
    in float32: large positions would lose whole turns otherwise.
    """

    theta: float = Field(default=10000.0, gt=1, description="Base of the rotation frequencies.")
    fraction: float = Field(default=1.0, gt=0, le=1, description="Share of each head's channels that rotate.")
    interleaved: bool = Field(default=False, description="Pair adjacent channels (GPT-J) instead of halves (NeoX/Llama).")
    scaling: SubComponent("rope_scaling") | None = Field(  # type: ignore[valid-type]
        default=None, description="How frequencies change for long contexts (a rope_scaling component); none by default."
    )

    def sized(self, *, head_dim: int, context_length: int) -> Sized:
        rotary_dim = rotary_dim_of(head_dim, self.fraction)
        if self.scaling is not None:
            self.scaling.sized(rotary_dim=rotary_dim, theta=self.theta, context_length=context_length)
        return Sized(parameters=0)


class ALiBiParams(Params):
    """No position embedding; each head penalises a score by ``slope * distance`` to the key.

    The score of query position ``i`` and key position ``j`` gets ``-m_h * (i - j)``, with
    head slopes ``m_h`` a geometric sequence ``2^(-8/n), 2^(-16/n), ...`` for ``n`` heads
    (a power of two) and, for other head counts, the slopes of the nearest lower power of
    two followed by every other slope of the next power, as in the paper's code. The bias
    is computed from absolute query and key positions, so it works with a KV cache (key
    positions come from the cache) and with SDPA (as an additive float mask).
    """

    def sized(self, *, n_heads: int) -> Sized:
        if n_heads < 1:
            raise ValueError(f"ALiBi needs at least one head, got n_heads={n_heads}")
        return Sized(parameters=0)


class NoPositionsParams(Params):
    """No positional encoding at all; the causal mask alone tells order (Kazemnejad et al. 2023)."""

    def sized(self) -> Sized:
        return Sized(parameters=0)


def rotary_dim_of(head_dim: int, fraction: float) -> int:
    """Channels of a head that rotate: ``head_dim * fraction`` rounded down to an even number."""
    rotary_dim = int(head_dim * fraction)
    rotary_dim -= rotary_dim % 2
    if rotary_dim < 2:
        raise ValueError(f"rope rotates {rotary_dim} channels of head_dim {head_dim} with fraction {fraction}; need at least 2")
    return rotary_dim
