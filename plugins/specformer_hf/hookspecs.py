"""The hook through which plugins teach ``specformer hf`` a new Hugging Face family.

A plugin that wants ``specformer hf import`` / ``export`` to understand another
``model_type`` implements::

    import specformer_hf

    @specformer_hf.hookimpl
    def specformer_hf_register_families(families):
        families.add(MY_FAMILY)          # a specformer_hf.Family

and declares its module under ``[project.entry-points.specformer]`` like any other
specformer plugin. The built-in families are registered through this same hook.

The hf plugin adds this hook specification to the plugin manager lazily, the first
time the families are needed (:func:`specformer_hf.family.get_families`), so that
loading specformer costs nothing for people who never touch Hugging Face files.
Until then a plugin's implementation has no specification to be checked against;
:data:`hookimpl` marks it optional so the plugin manager does not reject it as
unknown at start-up, and pluggy checks its signature when the spec is added.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specformer.hookspecs import PROJECT, hookspec
from specformer.hookspecs import hookimpl as _core_hookimpl

if TYPE_CHECKING:
    from specformer_hf.family import Families


def hookimpl(function: Any = None, **options: Any) -> Any:
    """Mark a ``specformer_hf_*`` hook implementation (an optional hook, see the module doc)."""
    options.setdefault("optionalhook", True)
    return _core_hookimpl(function, **options) if function is not None else _core_hookimpl(**options)


@hookspec
def specformer_hf_register_families(families: "Families") -> None:
    """Add Hugging Face model families (:class:`specformer_hf.Family`) with ``families.add(family)``.

    A family maps one Hugging Face ``model_type``: its ``config.json`` fields to a spec
    and back, and its tensor names to the Decoder's parameters and back. Adding a
    ``model_type`` another plugin already added raises
    :class:`~specformer.errors.RegistryError` naming both plugins.
    """


__all__ = ["PROJECT", "hookimpl", "specformer_hf_register_families"]
