"""How big a spec'd model is, found without building it.

The estimate builds, on the ``meta`` device (shapes only, no memory), the model's
skeleton (embedding, positional scheme, final norm, head) and one block per distinct
layer (see :mod:`specformer.spec.layer_groups`), then multiplies each block by the number
of layers that share it. Its cost does not grow with ``n_layers``, so ``validate`` and
``summary`` stay fast for any size, and ``build``/``load`` can refuse a model that
would not fit before allocating it (:mod:`specformer.machine.memory`).

Components are assumed to have the same parameter shapes at every layer index that
shares a block (true of every built-in: shapes follow params and sizes only).

This estimate is also the last check every spec goes through (see
:mod:`specformer.spec.check`): each component checks its own sizes while being
constructed (``n_heads`` must divide ``d_model``).

Public: :class:`SizeEstimate` and :func:`estimate_resolved` (the size check of a
validated model). For a spec, file or dict, :func:`specformer.spec.check.estimate`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from specformer.model.assemble import (check_layer_positionals, make_block, make_decoder, make_residual_stream,
                                       positional_mixer)
from specformer.errors import Problem, SpecError
from specformer.registry.discovery import get_registry
from specformer.registry.components import Registry
from specformer.spec.shapes import Spec, read_spec_file
from specformer.spec.validate import ResolvedModel, plugin_problems, validate

#: Largest byte count any model may have: beyond it no address space holds the weights.
ADDRESSABLE_BYTES = 2**63 - 1


@dataclass
class SizeEstimate:
    """A model's shapes: its skeleton and each distinct block with how many layers use it (all on meta)."""

    skeleton: nn.Module  # the Decoder with no blocks: embedding, positional, final norm, head
    blocks: list[tuple[nn.Module, int]] = field(default_factory=list)  # (block, layers sharing it)

    @property
    def n_layers(self) -> int:
        return sum(count for _, count in self.blocks)

    @property
    def parameters(self) -> int:
        """Number of parameters (a tied embedding counted once)."""
        return sum(p.numel() * count for p, count in self._tensors(buffers=False))

    def parameter_bytes(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of the parameters when floating ones are held in ``dtype`` (default: as built, float32)."""
        return sum(_bytes(p, dtype) * count for p, count in self._tensors(buffers=False))

    def buffer_bytes(self, dtype: torch.dtype | None = None) -> int:
        """Bytes of the buffers (RoPE tables, masks) when floating ones are held in ``dtype``."""
        return sum(_bytes(b, dtype) * count for b, count in self._tensors(buffers=True))

    def total_bytes(self, dtype: torch.dtype | None = None) -> int:
        """Parameters and buffers: what :func:`specformer.build` allocates."""
        return self.parameter_bytes(dtype) + self.buffer_bytes(dtype)

    def _tensors(self, *, buffers: bool) -> Iterator[tuple[torch.Tensor, int]]:
        parts = [(self.skeleton, 1), *self.blocks]
        for module, count in parts:
            seen: set[int] = set()
            tensors = module.buffers() if buffers else module.parameters()
            for t in tensors:
                if id(t) not in seen:
                    seen.add(id(t))
                    yield t, count


def estimate_resolved(resolved: ResolvedModel) -> SizeEstimate:
    """Build the skeleton and one block per distinct layer on meta; SpecError for sizes that cannot exist.

    This is also the size check of validation: each component checks its own sizes
    while being constructed, and every per-layer positional scheme is built for its layer.
    """
    m = resolved.spec
    with torch.device("meta"):
        residual = make_residual_stream(resolved)
        blocks = [(make_block(g.parts, m, g.group.first, residual=residual), g.group.count) for g in resolved.groups]
        check_layer_positionals(resolved, [(b, g.parts.get("positional")) for (b, _), g in zip(blocks, resolved.groups)])
        skeleton = make_decoder(resolved, [], first_attention=positional_mixer([b for b, _ in blocks]), residual=residual)
    result = SizeEstimate(skeleton=skeleton, blocks=blocks)
    total = result.total_bytes()
    if total > ADDRESSABLE_BYTES:
        raise SpecError([Problem(
            "model",
            f"the model would need {total:.3e} bytes for its {result.parameters:.3e} parameters, "
            f"more than any machine can address (2^63 bytes); make the sizes smaller",
        )])
    return result


def _bytes(t: torch.Tensor, dtype: torch.dtype | None) -> int:
    held = dtype if dtype is not None and t.is_floating_point() else t.dtype
    return t.numel() * torch.empty((), dtype=held).element_size()


__all__ = ["ADDRESSABLE_BYTES", "SizeEstimate", "estimate_resolved"]
