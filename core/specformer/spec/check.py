"""The spec pipeline: read, validate, resolve and size a spec, each step once.

:func:`check_spec` is every check the core has, in one direction:

1. shapes (:mod:`specformer.spec.shapes`): the structure of the file, no registry;
2. validation (:mod:`specformer.spec.validate`): every ``kind`` resolved against the
   registry, each plugin's section checked by the model it registered;
3. sizes (:mod:`specformer.spec.size_check`): constraints between sizes (``n_heads`` must
   divide ``d_model``), each declared by its component, run through the builder's size
   flow without building anything and without importing torch;
4. the plugins' ``specformer_validate_spec`` hooks.

It returns everything it found (:class:`CheckedSpec`), so that :func:`specformer.build`
and :func:`specformer.load` reuse it instead of doing it again. The model's shapes on the
``meta`` device (:mod:`specformer.model.sizes`, torch) are made the first time
:attr:`CheckedSpec.shape` is read: by ``build`` and ``load`` (memory), :func:`estimate`
and :func:`model_bytes`, never by ``validate``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specformer.errors import SpecError
from specformer.registry.components import Registry
from specformer.registry.discovery import get_registry
from specformer.renamed import upgrade_spec
from specformer.spec.shapes import Spec, read_spec_file
from specformer.spec import size_check
from specformer.spec.size_check import SizeCheck
from specformer.spec.validate import ResolvedModel, plugin_problems, validate

if TYPE_CHECKING:
    import torch

    from specformer.model.sizes import SizeEstimate


#: The checks a spec with problems does not reach, named after its problems.
SIZES_NOT_CHECKED = "the sizes between components (they need valid components)"
PLUGINS_NOT_CHECKED = "the plugins' own checks"


@dataclass
class CheckedSpec:
    """A spec that passed every check, with what the checks found: its resolved model and its sizes."""

    spec: Spec
    resolved: ResolvedModel
    sizes: SizeCheck | None  # None when the size check was skipped
    source: str | None = None

    @functools.cached_property
    def shape(self) -> SizeEstimate | None:
        """The model's shapes on the meta device (made once, on first reading: imports torch); None without the size check."""
        if self.sizes is None:
            return None
        from specformer.model.sizes import estimate_resolved  # late: only the estimate needs torch

        try:
            return estimate_resolved(self.resolved)  # one block per distinct layer, on the meta device
        except SpecError as exc:
            raise SpecError(exc.problems, source=self.source) from None


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
    data = upgrade_spec(data, source=source)  # keys written before a rename (attention: -> mixer:), said once
    try:
        validated = validate(data, registry=registry, source=source)
    except SpecError as exc:  # the later checks need a valid spec: say so once rather than hide them
        later = [*exc.not_checked, *((SIZES_NOT_CHECKED,) if check_sizes else ()), PLUGINS_NOT_CHECKED]
        raise SpecError(exc.problems, source=exc.source, not_checked=later) from None
    sizes = None
    if check_sizes:
        try:
            sizes = size_check.check_sizes(validated.resolved)  # each component's declared check, no torch
        except SpecError as exc:
            raise SpecError(exc.problems, source=source) from None
    problems = plugin_problems(validated.spec, registry)
    if problems:
        raise SpecError(problems, source=source)
    return CheckedSpec(spec=validated.spec, resolved=validated.resolved, sizes=sizes, source=source)


def estimate(spec: "Any", *, registry: Any = None) -> SizeEstimate:
    """The :class:`SizeEstimate` of a spec (a :class:`~specformer.spec.Spec`, a file path or a dict).

    The spec is validated first (a :class:`SpecError` if it does not); nothing is allocated.
    """
    shape = check_spec(spec, registry=registry).shape
    assert shape is not None
    return shape


def model_bytes(spec: "Any", *, dtype: "torch.dtype | None" = None, registry: Any = None) -> int:
    """Bytes the parameters and buffers of ``spec``'s model take in ``dtype`` (default float32), unallocated."""
    return estimate(spec, registry=registry).total_bytes(dtype)


__all__ = ["CheckedSpec", "check_spec", "estimate", "model_bytes"]
