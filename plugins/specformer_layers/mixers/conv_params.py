"""The width of a mixer's short causal convolution, as every mixer's settings declare it: :data:`ConvTaps`.

Torch-free (listing components reads only the params modules).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, ValidationInfo

#: The fewest taps a causal convolution that carries a window between forwards can have.
MIN_TAPS = 2


def _keeps_a_window(value: int, info: ValidationInfo) -> int:
    # One tap would read the token alone and keep an empty window (no state to carry); the spec's
    # report names the field and adds "(got <value>)".
    if value < MIN_TAPS:
        raise ValueError(f"{info.field_name} must be at least {MIN_TAPS} (the causal convolution spans the token and "
                         f"at least one before it, and carries its last {info.field_name} - 1 inputs between forwards)")
    return value


#: Taps of a short depthwise causal convolution (:func:`~specformer_layers.mixers.causal_conv`): an int >= 2.
#: The schema shows the minimum; the check is :func:`_keeps_a_window`, so the message is this one everywhere.
ConvTaps = Annotated[int, AfterValidator(_keeps_a_window), Field(json_schema_extra={"minimum": MIN_TAPS})]

__all__ = ["ConvTaps", "MIN_TAPS"]
