"""specformer's quantization plugin: int8, int4 and bf16 weights (a registry kind ``quantization``),
quantized checkpoints, and the ``specformer quantize`` command.

::

    from specformer_quant import quantize
    quantize(model, "int8")                        # in place; returns the recipe
    quantize(model, {"kind": "int4", "group_size": 32})

:class:`QuantizedLinear` is the layer a quantized model's linear layers become (what an
adapter wraps to train on a quantized base).

Names are imported on first use, so loading the plugin (which every ``specformer``
command does) imports nothing heavy.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

_EXPORTS = {
    "quantize": "specformer_quant.apply",
    "weight_bytes": "specformer_quant.apply",
    "QuantizedLinear": "specformer_quant.weights",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
