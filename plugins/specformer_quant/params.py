"""The settings of the quantization schemes, in a module that imports no torch.

Each model's docstring is the scheme's description in the catalogue (its first line the summary).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specformer.registry.params import Params


class Int8Params(Params):
    """Symmetric per-output-channel int8 weights (half of bf16, a quarter of float32).

    On CPU fbgemm's int8 x int8 kernel with per-row activation scales (per-call with
    dynamic_activations: rows then depend on each other).
    """

    dynamic_activations: bool = Field(default=False, description=(
        "fbgemm's int8 x int8 CPU kernel with one activation scale per call instead of one per row: a little "
        "faster with several rows, but a row's output then depends on the other rows and tokens in the forward"))


class Int4Params(Params):
    """Asymmetric group-wise 4-bit weights (a scale and a minimum per group of inputs, two weights a byte).

    On CPU PyTorch's int4-pack kernel with bfloat16 activations.
    """

    group_size: Literal[32, 64, 128] = Field(default=32, description="inputs sharing one scale and minimum")


class Bf16Params(Params):
    """Weights stored and multiplied in bfloat16: half the bytes of float32, float32's exponent range.

    No settings: bfloat16 has one layout.
    """
