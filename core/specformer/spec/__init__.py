"""The spec: what a person writes down to describe a model (and, through plugins, its training).

This is the module plugins and users import a spec from: its shapes (the pydantic
models of :mod:`specformer.spec.shapes`) and :func:`load_spec`, which takes a spec
through every check the core has, each once, in one direction:

1. shapes (:mod:`specformer.spec.shapes`): the structure of the file, no registry;
2. validation (:mod:`specformer.spec.validate`): every ``kind`` resolved against the
   registry, each plugin's section checked by the model it registered;
3. sizes (:mod:`specformer.spec.size_check`): constraints between sizes (``n_heads`` must
   divide ``d_model``), each declared by its component and asked without building or
   importing torch; then the plugins' ``specformer_validate_spec`` hooks.

:func:`specformer.build` goes on from there (:mod:`specformer.model.builder`), reusing what
those steps found. Every problem is reported with the dotted path of its field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specformer.spec.shapes import (
    BLOCK_FIELDS,
    SPEC_SUFFIXES,
    BlockSpec,
    ComponentRef,
    LayerOverride,
    ModelSpec,
    Spec,
    as_component_ref,
    layer_selection,
    problems_from_validation_error,
    read_spec_file,
    select_layers,
)


def load_spec(source: "str | Path | dict[str, Any] | Spec", *, registry: Any = None, check_sizes: bool = True) -> Spec:
    """Read and fully validate a spec from a file path, a dict, or an existing :class:`Spec`.

    Raises :class:`~specformer.errors.SpecError` listing every problem with its path.
    """
    from specformer.spec.check import check_spec  # late: the pipeline imports the registry, which imports this package

    return check_spec(source, registry=registry, check_sizes=check_sizes).spec


__all__ = [
    "BLOCK_FIELDS",
    "SPEC_SUFFIXES",
    "BlockSpec",
    "ComponentRef",
    "LayerOverride",
    "ModelSpec",
    "Spec",
    "as_component_ref",
    "layer_selection",
    "load_spec",
    "problems_from_validation_error",
    "read_spec_file",
    "select_layers",
]
