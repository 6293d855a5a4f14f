"""specformer's quantization plugin: int8, int4 and bf16 weights (a registry kind ``quantization``),
quantized checkpoints, and the ``specformer quantize`` command.

::

    from specformer_quant import quantize
    quantize(model, "int8")                        # in place; returns the recipe
    quantize(model, {"kind": "int4", "group_size": 32})
"""

from __future__ import annotations

from specformer_quant.apply import quantize, weight_bytes

__all__ = ["quantize", "weight_bytes"]
