"""The settings of the positional schemes, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field

from specformer.registry.params import Params, SubComponent


class LearnedPositionsParams(Params):
    """A trained vector per position, added to the token embeddings (GPT-2, Radford et al. 2019)."""


class SinusoidalPositionsParams(Params):
    """sin/cos of the position at geometrically spaced frequencies, added to the embeddings.

    ``PE[p, 2i] = sin(p / base^(2i/d))``, ``PE[p, 2i+1] = cos(p / base^(2i/d))``.
    Computed from the positions on every forward, so it has no length limit.
    """

    base: float = Field(default=10000.0, gt=1, description="The wavelength base (10000 in the paper).")


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


class ALiBiParams(Params):
    """No position embedding; each head penalises a score by ``slope * distance`` to the key.

    The score of query position ``i`` and key position ``j`` gets ``-m_h * (i - j)``, with
    head slopes ``m_h`` a geometric sequence ``2^(-8/n), 2^(-16/n), ...`` for ``n`` heads
    (a power of two) and, for other head counts, the slopes of the nearest lower power of
    two followed by every other slope of the next power, as in the paper's code. The bias
    is computed from absolute query and key positions, so it works with a KV cache (key
    positions come from the cache) and with SDPA (as an additive float mask).
    """


class NoPositionsParams(Params):
    """No positional encoding at all; the causal mask alone tells order (Kazemnejad et al. 2023)."""
