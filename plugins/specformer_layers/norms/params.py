"""The settings of the normalisation layers, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized


class LayerNormParams(Params):
    """Subtract the mean, divide by the standard deviation, then scale (and shift) per channel.

    ``y = (x - mean(x)) / sqrt(var(x) + eps) * (offset + weight) + bias``. ``bias: false`` drops the
    shift (as in nanoGPT's bias-free configs); ``affine: false`` drops both (OLMo). ``offset: 1``
    stores the scale as ``weight - 1``, so the weight initialises to zero (Nemotron's LayerNorm1P,
    as Gemma's RMSNorm does with the same option).
    """

    eps: float = Field(default=1e-5, gt=0, description="Added to the variance for stability.")
    bias: bool = Field(default=True, description="Learn a per-channel shift.")
    affine: bool = Field(default=True, description="Learn a per-channel scale (and shift); false = non-parametric.")
    offset: float = Field(default=0.0, description="Added to the weight before scaling (1.0 for Nemotron's LayerNorm1P).")

    @model_validator(mode="after")
    def _offset_needs_weight(self) -> "LayerNormParams":
        if not self.affine and self.offset:
            raise ValueError(f"offset ({self.offset}) is added to the weight, so it needs affine: true; "
                             "a non-parametric norm does not scale")
        return self

    def sized(self, *, dim: int) -> Sized:
        return Sized(parameters=(dim if self.affine else 0) + (dim if self.affine and self.bias else 0))


class RMSNormParams(Params):
    """Divide by the root mean square of the channels, then scale: ``x / sqrt(mean(x^2) + eps) * (offset + weight)``.

    Lower-precision inputs are normalised in float32, as Llama and Gemma do (float64 stays
    float64). ``offset: 1`` stores the scale as ``weight - 1`` (Gemma), so the weight
    initialises to zero. ``weight: false`` learns no scale at all (Gemma 4's value norm).
    """

    eps: float = Field(default=1e-6, gt=0, description="Added to the mean square for stability.")
    offset: float = Field(default=0.0, description="Added to the weight before scaling (1.0 for Gemma).")
    weight: bool = Field(default=True, description="Learn a per-channel scale; false: none (Gemma 4's value norm).")

    @model_validator(mode="after")
    def _offset_needs_weight(self) -> "RMSNormParams":
        if not self.weight and self.offset:
            raise ValueError(f"offset ({self.offset}) is added to the weight, so it needs weight: true; "
                             "without a weight the norm does not scale")
        return self

    def sized(self, *, dim: int) -> Sized:
        return Sized(parameters=dim if self.weight else 0)


class ScaleNormParams(Params):
    """Project each vector onto a sphere of learned radius: ``g * x / max(||x||_2, eps)``.

    A single scalar ``g`` per norm, initialised to ``sqrt(dim)`` so that the output has
    unit root mean square at the start, as in the paper. Computed in float32 for
    lower-precision inputs.
    """

    eps: float = Field(default=1e-5, gt=0, description="Lower bound of the vector norm (avoids dividing by zero).")

    def sized(self, *, dim: int) -> Sized:
        return Sized(parameters=1)  # one scalar, whatever the width

class L2NormParams(Params):
    """Rescale each vector to a fixed length, without a learned weight: ``x / sqrt(mean(x^2) + eps)``.

    Every output has root mean square 1 (an L2 norm of ``sqrt(dim)``): only the direction of
    ``x`` survives. Llama 4 applies it to queries and keys on its rotary layers
    (transformers' ``Llama4TextL2Norm``, ``use_qk_norm``) to bound attention logits.
    Lower-precision inputs are normalised in float32 and cast back.
    """

    eps: float = Field(default=1e-6, gt=0, description="Added to the mean square for stability.")

    def sized(self, *, dim: int) -> Sized:
        return Sized(parameters=0)  # no learned weight


class NoNormParams(Params):
    """No normalisation: the input passes through unchanged, with no weights.

    For a place that would otherwise have a norm: ``final_norm: none`` for a model whose
    post-norm blocks already end normalised (GPT-1, the original transformer's decoder), or
    a block whose layout should place no norm at all.
    """

    def sized(self, *, dim: int) -> Sized:
        return Sized(parameters=0)
