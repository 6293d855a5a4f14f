"""The settings of the RoPE scalings, importable without torch (listing components reads only these).

Where a param defaults to ``None`` the scaling derives it from the model's
``context_length``, a size every scaling receives, so a spec and a Python caller get
the same value.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized


def check_rotary_dim(rotary_dim: int) -> None:
    """Every scaling turns channel pairs: an even ``rotary_dim`` of at least 2."""
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rope scaling needs an even rotary_dim >= 2, got {rotary_dim}")


class ScalingParams(Params):
    """What every scaling's params share: the size check of a rotary width (a scaling holds no parameters)."""

    def sized(self, *, rotary_dim: int) -> Sized:
        check_rotary_dim(rotary_dim)
        return Sized(parameters=0)


class LinearScalingParams(ScalingParams):
    """Divide every frequency by ``factor``: position ``p`` is rotated as ``p / factor`` was.

    A model trained on ``L`` tokens then sees ``factor * L`` positions squeezed into the
    angles it knows. Needs some fine-tuning to work well (Chen et al. 2023).
    """

    factor: float = Field(gt=0, description="How many times longer the context becomes; frequencies are divided by it.")


class DynamicNTKScalingParams(ScalingParams):
    """Raise theta with the sequence length once it passes the trained context, leaving shorter ones alone.

    For a forward pass whose longest position is ``L - 1`` with ``L > original_context_length``
    (``C``), theta becomes ``theta * (factor * L / C - (factor - 1)) ^ (d / (d - 2))`` with
    ``d`` = rotary_dim; for ``L <= C`` the frequencies are RoPE's own. ``L`` is taken over
    the whole batch of the forward pass, so every token of a length-``T`` forward is rotated
    as in one of length ``T``.

    Under a KV cache the keys of earlier steps stay rotated with the frequencies of the
    step that wrote them, while new queries use the current length's: the same thing
    transformers does (it caches rotated keys too), and the reason generation with dynamic
    scaling differs slightly from one full forward over the same tokens.
    """

    factor: float = Field(gt=0, description="Scaling strength: at length factor * C theta grows by factor^(d/(d-2)).")
    original_context_length: int | None = Field(
        default=None, gt=0,
        description="Length C up to which frequencies are left unchanged; default the model's context_length "
                    "(transformers' max_position_embeddings).",
    )

    def sized(self, *, rotary_dim: int) -> Sized:
        check_rotary_dim(rotary_dim)
        if rotary_dim <= 2:
            raise ValueError(f"dynamic rope scaling needs rotary_dim > 2 (its exponent is d/(d-2)), got {rotary_dim}")
        return Sized(parameters=0)


class YarnScalingParams(ScalingParams):
    """Interpolate low frequencies, keep high ones, blend in between; sharpen attention.

    Channel pairs that turn fewer than ``beta_slow`` times over the original context are
    interpolated (divided by ``factor``), pairs that turn more than ``beta_fast`` times are
    left alone, and a linear ramp blends the pairs between. cos and sin are multiplied by
    the attention factor ``0.1 * mscale * ln(factor) + 1`` (or the ratio of two such
    terms with ``mscale`` and ``mscale_all_dim``, DeepSeek style, or ``attention_factor``
    when given), exactly as transformers' ``yarn`` does.
    """

    factor: float | None = Field(
        default=None, gt=0,
        description="Context extension ratio; default context_length / original_context_length.",
    )
    original_context_length: int = Field(gt=0, description="The context length the model was pre-trained with.")
    beta_fast: float = Field(default=32.0, gt=0, description="Pairs turning more often than this over the original context keep their frequency.")
    beta_slow: float = Field(default=1.0, gt=0, description="Pairs turning less often than this are fully interpolated.")
    mscale: float | None = Field(default=None, description="Scales ln(factor) in the attention factor (with mscale_all_dim).")
    mscale_all_dim: float | None = Field(default=None, description="Denominator's mscale of the attention factor (DeepSeek).")
    attention_factor: float | None = Field(default=None, gt=0, description="Multiplier of cos/sin; default from factor and mscale.")
    truncate: bool = Field(default=True, description="Round the ramp's bounds to whole channel pairs (floor/ceil).")

    @model_validator(mode="after")
    def _fast_above_slow(self) -> "YarnScalingParams":
        if self.beta_fast < self.beta_slow:
            raise ValueError(f"beta_fast ({self.beta_fast}) must be at least beta_slow ({self.beta_slow})")
        return self


class Llama3ScalingParams(ScalingParams):
    """Divide long-wavelength frequencies by ``factor``, keep short ones, blend smoothly between.

    With ``C`` the original context: a pair whose wavelength exceeds ``C / low_freq_factor``
    is divided by ``factor``; one shorter than ``C / high_freq_factor`` is kept; in between,
    ``(1 - s) * f / factor + s * f`` with ``s = (C / wavelength - low) / (high - low)``.
    The defaults are Llama 3.1's.
    """

    factor: float = Field(default=8.0, gt=0, description="Divisor of the low frequencies (8 for Llama 3.1, 32 for Llama 3.2).")
    low_freq_factor: float = Field(default=1.0, gt=0, description="Wavelengths above C / low_freq_factor are fully scaled.")
    high_freq_factor: float = Field(default=4.0, gt=0, description="Wavelengths below C / high_freq_factor are kept.")
    original_context_length: int = Field(default=8192, gt=0, description="The pre-training context C.")

    @model_validator(mode="after")
    def _high_above_low(self) -> "Llama3ScalingParams":
        if self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"high_freq_factor ({self.high_freq_factor}) must be greater than low_freq_factor ({self.low_freq_factor})"
            )
        return self


class LongRopeScalingParams(ScalingParams):
    """Divide each pair's frequency by its own searched factor: ``short_factor`` or ``long_factor``.

    A forward pass whose longest position reaches past ``original_context_length`` uses the
    long factors, a shorter one the short factors (taken over the whole batch, as
    transformers does). cos and sin are multiplied by ``attention_factor``, by default
    ``sqrt(1 + ln(factor) / ln(original_context_length))``. Under a KV cache, keys keep
    the rotation of the step that wrote them (as transformers' Llama does), unless
    ``reencode``: then generation encodes the whole sequence again, once, when it first
    passes ``original_context_length``, so every key uses the long factors (as
    transformers' Phi-3 ``generate`` does by dropping its cache there).
    """

    short_factor: list[float] = Field(description="One divisor per rotary channel pair (rotary_dim / 2 values) for short inputs.")
    long_factor: list[float] = Field(description="One divisor per rotary channel pair for inputs longer than original_context_length.")
    original_context_length: int = Field(gt=0, description="The pre-training context length.")
    factor: float | None = Field(default=None, gt=0, description="Context extension ratio for the attention factor; default context_length / original_context_length.")
    attention_factor: float | None = Field(default=None, gt=0, description="Multiplier of cos/sin; default from factor.")
    reencode: bool = Field(
        default=False,
        description="Generation re-encodes the sequence once when it passes original_context_length (Phi-3's "
                    "transformers generate does); otherwise cached keys keep their short-factor rotation (Llama's).",
    )

    def sized(self, *, rotary_dim: int) -> Sized:
        for name, values in (("short_factor", self.short_factor), ("long_factor", self.long_factor)):
            if len(values) != rotary_dim // 2:
                raise ValueError(
                    f"longrope {name} has {len(values)} values; it needs one per rotary channel pair: {rotary_dim // 2}"
                )
            if any(v <= 0 for v in values):
                raise ValueError(f"longrope {name} values must be > 0, got {values}")
        return super().sized(rotary_dim=rotary_dim)


class ProportionalScalingParams(Params):
    """Turn only the first ``fraction`` of each head's channel pairs, at the frequencies RoPE gives them in the
    whole head; the other pairs do not turn at all (their frequency is 0). Every frequency is divided by ``factor``.

    Pair ``i`` (of ``rotary_dim / 2``, paired as the rope pairs them) turns by
    ``position * theta^(-2i / rotary_dim) / factor`` for ``i < int(fraction * rotary_dim // 2)``
    and not at all after: unlike the rope's own ``fraction``, the turning pairs keep the
    spacing of the whole head and every channel keeps its place (transformers'
    ``proportional`` rope type, Gemma 4's global layers with ``fraction: 0.25``).
    """

    fraction: float = Field(gt=0, le=1, description="Share of the channel pairs that turn (partial_rotary_factor).")
    factor: float = Field(default=1.0, gt=0, description="Every frequency is divided by this.")

    def sized(self, *, rotary_dim: int) -> Sized:
        check_rotary_dim(rotary_dim)
        return Sized(parameters=0)  # the frequencies are a table, not a parameter
