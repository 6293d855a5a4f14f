"""The spec pipeline: read, validate, resolve and size a spec, each step once.

:func:`check_spec` is every check the core has, in one direction:

1. shapes (:mod:`specformer.spec.shapes`): the structure of the file, no registry;
2. validation (:mod:`specformer.spec.validate`): every ``kind`` resolved against the
   registry, each plugin's section checked by the model it registered;
3. sizes (:mod:`specformer.model.sizes`): the model's shapes on the ``meta`` device, so
   that constraints between sizes (``n_heads`` must divide ``d_model``) are checked by the
   components themselves;
4. the plugins' ``specformer_validate_spec`` hooks.

It returns everything it found (:class:`CheckedSpec`), so that :func:`specformer.build`
and :func:`specformer.load` reuse it instead of doing it again. :func:`estimate` and
:func:`model_bytes` are its size step's answer for a spec.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specformer.errors import SpecError
from specformer.registry.components import Registry
from specformer.registry.discovery import get_registry
from specformer.spec.shapes import Spec, read_spec_file
from specformer.spec.validate import ResolvedModel, plugin_problems, validate

if TYPE_CHECKING:
    import torch

    from specformer.model.sizes import SizeEstimate


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
        # late: only sizing needs torch, so reading and validating a spec starts without it
        from specformer.model.sizes import estimate_resolved

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


def model_bytes(spec: "Any", *, dtype: "torch.dtype | None" = None, registry: Any = None) -> int:
    """Bytes the parameters and buffers of ``spec``'s model take in ``dtype`` (default float32), unallocated."""
    return estimate(spec, registry=registry).total_bytes(dtype)


__all__ = ["CheckedSpec", "check_spec", "estimate", "model_bytes"]
