"""Attention: the built-in layers, their kernels, and the evaluation of the mask rule.

What another plugin's attention may use, so it reads the same keys and runs the same
kernels as the built-ins: :func:`attend` (the kernel chosen and run for ``q``, ``k``,
``v`` and a :class:`~specformer.model.masks.MaskRule`), :class:`Scores` (what modifies its
scores) and :func:`attention_mask` (the dense boolean mask of a forward, for a kernel of
its own). They are imported on first use: listing components reads this package's
``params`` module without importing torch.
"""

from specformer.lazy import lazy_exports

_EXPORTS = {
    "Scores": "specformer_layers.attention.kernels",
    "attend": "specformer_layers.attention.kernels",
    "describe": "specformer_layers.attention.kernels",
    "attention_mask": "specformer_layers.attention.masking",
    "causal_mask": "specformer_layers.attention.masking",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
