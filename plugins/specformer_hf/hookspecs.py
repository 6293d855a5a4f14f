"""The hook through which plugins teach ``specformer hf`` a new Hugging Face family.

A plugin that wants ``specformer hf import`` / ``export`` to understand another
``model_type`` implements::

    import specformer_hf

    @specformer_hf.hookimpl
    def specformer_hf_register_families(families):
        families.add(MY_FAMILY)          # a specformer_hf.Family

and declares its module under ``[project.entry-points.specformer]`` like any other
specformer plugin. The built-in families are registered through this same hook.

The hf plugin adds this specification to the plugin manager when it is registered
(its ``specformer_add_hookspecs``, the core's mechanism for a plugin's own extension
points), so an implementation is checked against it whatever order plugins load in.
:data:`hookimpl` is specformer's own marker, re-exported for convenience.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specformer.registry.hookspecs import PROJECT, hookimpl, hookspec

if TYPE_CHECKING:
    from specformer_hf.family import Families


@hookspec
def specformer_hf_register_families(families: "Families") -> None:
    """Add Hugging Face model families (:class:`specformer_hf.Family`) with ``families.add(family)``.

    A family maps one Hugging Face ``model_type``: its ``config.json`` fields to a spec
    and back, and its tensor names to the Decoder's parameters and back. Adding a
    ``model_type`` another plugin already added raises
    :class:`~specformer.errors.RegistryError` naming both plugins.
    """


__all__ = ["PROJECT", "hookimpl", "specformer_hf_register_families"]
