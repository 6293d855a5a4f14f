"""Attention: the built-in layers, their kernels, and the evaluation of the mask rule.

What another plugin's attention may use, so it reads the same keys and runs the same
kernels as the built-ins: :func:`attend` (the kernel chosen and run for ``q``, ``k``,
``v`` and a :class:`~specformer.model.masks.MaskRule`), :class:`Scores` (what modifies its
scores) and :func:`attention_mask` (the dense boolean mask of a forward, for a kernel of
its own).
"""

from specformer_layers.attention.kernels import Scores, attend, describe
from specformer_layers.attention.masking import attention_mask, causal_mask

__all__ = ["Scores", "attend", "attention_mask", "causal_mask", "describe"]
