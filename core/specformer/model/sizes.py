"""How big a spec'd model is, found without building it.

The estimate builds, on the ``meta`` device (shapes only, no memory), the model's
skeleton (embedding, positional scheme, final norm, head) and one block per distinct
layer (see :mod:`specformer.spec.layer_groups`), then multiplies each block by the number
of layers that share it. Its cost does not grow with ``n_layers``, so ``validate`` and
``summary`` stay fast for any size, and ``build``/``load`` can refuse a model that
would not fit before allocating it (:mod:`specformer.machine.memory`).

Components are assumed to have the same parameter shapes at every layer index that
shares a block (true of every built-in: shapes follow params and sizes only).

The blocks are made by the builder's size flow (:mod:`specformer.model.wiring`), the same
flow the torch-free size check of validation runs over the components' declared checks
(:mod:`specformer.spec.size_check`); a component's constructor refuses the same sizes here.

Public: :class:`SizeEstimate` and :func:`estimate_resolved` (the size check of a
validated model). For a spec, file or dict, :func:`specformer.spec.check.estimate`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch import nn

from specformer.errors import Problem, SpecError
from specformer.model.assemble import MODULES, make_decoder
from specformer.model.shared import UseParts
from specformer.model.wiring import size_flow
from specformer.spec.size_check import ADDRESSABLE_BYTES, unaddressable_message
from specformer.spec.validate import ResolvedModel



@dataclass
class SizeEstimate:
    """A model's shapes: its skeleton and each distinct block with how many layers use it (all on meta)."""

    skeleton: nn.Module  # the Decoder with no blocks: embedding, positional, final norm, head
    blocks: list[tuple[nn.Module, int]] = field(default_factory=list)  # (block, layers sharing it)
    # (shared block, layers that run it): its tensors are the skeleton's (counted once), its compute is per use.
    shared_uses: list[tuple[nn.Module, int]] = field(default_factory=list)
    # (what one use of a shared block has of its own, its uses): projection and adapters, counted per use.
    use_parts: list[tuple[nn.Module, int]] = field(default_factory=list)

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
        parts = [(self.skeleton, 1), *self.blocks, *self.use_parts]
        for module, count in parts:
            seen: set[int] = set()
            tensors = module.buffers() if buffers else module.parameters()
            for t in tensors:
                if id(t) not in seen:
                    seen.add(id(t))
                    yield t, count


def estimate_resolved(resolved: ResolvedModel) -> SizeEstimate:
    """Build the skeleton and one block per distinct layer on meta; SpecError for sizes that cannot exist.

    Each component's constructor checks its own sizes, and every per-layer positional
    scheme is built for its layer (the torch-free check of validation,
    :func:`specformer.spec.size_check.check_sizes`, has found the same problems first).
    """
    with torch.device("meta"):
        shapes = size_flow(MODULES, resolved)
        skeleton = make_decoder(resolved, shapes.skeleton, [])
    uses = Counter(name for name in resolved.shared_uses if name is not None) if resolved.shared_blocks else Counter()
    with torch.device("meta"):
        use_parts = [(UseParts(d_model=resolved.spec.d_model, projection=block.projection, adapters=block.adapters),
                      uses[name]) for name, block in resolved.spec.shared_blocks.items()
                     if block.projection or block.adapters is not None]
    result = SizeEstimate(skeleton=skeleton, blocks=[(b.block, count) for b, count in shapes.blocks],
                          shared_uses=[(skeleton.shared_blocks[name], n) for name, n in uses.items()],
                          use_parts=use_parts)
    total = result.total_bytes()
    if total > ADDRESSABLE_BYTES:
        raise SpecError([Problem("model", unaddressable_message(total, result.parameters))])
    return result


def _bytes(t: torch.Tensor, dtype: torch.dtype | None) -> int:
    held = dtype if dtype is not None and t.is_floating_point() else t.dtype
    return t.numel() * torch.empty((), dtype=held).element_size()


__all__ = ["ADDRESSABLE_BYTES", "SizeEstimate", "estimate_resolved"]
