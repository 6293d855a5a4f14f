"""How big a spec'd model is, found without building it.

The estimate builds, on the ``meta`` device (shapes only, no memory), the model's
skeleton (embedding, positional scheme, final norm, head) and one block per distinct
layer (see :mod:`specformer.spec.layer_groups`), then multiplies each block by the number
of layers that share it. Its cost does not grow with ``n_layers``, so ``validate`` and
``summary`` stay fast for any size, and ``build``/``load`` can refuse a model that
would not fit before allocating it (:mod:`specformer.machine.memory`).

Components are assumed to have the same parameter shapes at every layer index that
shares a block (true of every built-in: shapes follow params and sizes only).

This estimate is also the last check every spec goes through: each component checks
its own sizes while being constructed (``n_heads`` must divide ``d_model``), then the
plugins' ``specformer_validate_spec`` hooks run. :func:`check_spec` is that whole path
(read, validate and resolve once, size once) and returns everything it found, so that
:func:`specformer.build` and :func:`specformer.load` reuse it instead of doing it again.

Public: :func:`estimate` (a spec, file or dict in; a :class:`SizeEstimate` out),
:func:`model_bytes` (bytes of parameters and buffers in a dtype) and :func:`check_spec`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch
from torch import nn

from specformer.model.assemble import check_layer_positionals, make_block, make_decoder
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


@dataclass
class CheckedSpec:
    """A spec that passed every check, with what the checks found: its resolved model and its shapes."""

    spec: Spec
    resolved: ResolvedModel
    shape: SizeEstimate | None  # None when the size check was skipped


def check_spec(
    spec: "Spec | str | Path | dict[str, Any]",
    *,
    registry: Registry | None = None,
    source: str | None = None,
    check_sizes: bool = True,
) -> CheckedSpec:
    """Read (for a path), validate, resolve and size a spec: every check, each done once.

    ``source`` names the spec in messages (default: the path, when one is given).
    Raises :class:`SpecError` listing every problem found by the first step that finds any.
    """
    registry = registry if registry is not None else get_registry()
    if isinstance(spec, Spec):
        data = spec.to_dict()
    elif isinstance(spec, dict):
        data = spec
    else:
        source = source or str(spec)
        data = read_spec_file(spec)
    validated = validate(data, registry=registry, source=source)
    shape = None
    if check_sizes:
        try:
            shape = estimate_resolved(validated.resolved)  # one block per distinct layer, on the meta device
        except SpecError as exc:
            raise SpecError(exc.problems, source=source) from None
    problems = plugin_problems(validated.spec, registry)
    if problems:
        raise SpecError(problems, source=source)
    return CheckedSpec(spec=validated.spec, resolved=validated.resolved, shape=shape)


def estimate(spec: "Any", *, registry: Any = None) -> SizeEstimate:
    """The :class:`SizeEstimate` of a spec (a :class:`~specformer.spec.Spec`, a file path or a dict).

    The spec is validated first (a :class:`SpecError` if it does not); nothing is allocated.
    """
    shape = check_spec(spec, registry=registry).shape
    assert shape is not None
    return shape


def model_bytes(spec: "Any", *, dtype: torch.dtype | None = None, registry: Any = None) -> int:
    """Bytes the parameters and buffers of ``spec``'s model take in ``dtype`` (default float32), unallocated."""
    return estimate(spec, registry=registry).total_bytes(dtype)


def estimate_resolved(resolved: ResolvedModel) -> SizeEstimate:
    """Build the skeleton and one block per distinct layer on meta; SpecError for sizes that cannot exist.

    This is also the size check of validation: each component checks its own sizes
    while being constructed, and every per-layer positional scheme is built for its layer.
    """
    m = resolved.spec
    with torch.device("meta"):
        blocks = [(make_block(g.parts, m, g.group.first), g.group.count) for g in resolved.groups]
        check_layer_positionals(resolved, [(b, g.parts.get("positional")) for (b, _), g in zip(blocks, resolved.groups)])
        skeleton = make_decoder(resolved, [], first_attention=blocks[0][0].attention)
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


__all__ = ["ADDRESSABLE_BYTES", "CheckedSpec", "SizeEstimate", "check_spec", "estimate", "estimate_resolved", "model_bytes"]
