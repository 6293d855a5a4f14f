"""A package root whose public names are imported when first used.

A plugin's package root is its public API, and every ``specformer`` command loads every
plugin; importing what the root names (torch, jinja2, tokenizers) only when a name is
first used keeps ``specformer --help`` from paying for it::

    _EXPORTS = {"train": "specformer_train.run", "Trainer": "specformer_train.trainer"}
    __all__ = sorted(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], *, submodules: Iterable[str] = ()
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` (PEP 562) of ``package``.

    ``exports`` maps each public name to the module that defines it, or to
    ``"module:other_name"`` where the module calls it otherwise; ``submodules`` are names of
    the package's own subpackages, imported on first attribute access.
    """
    submodules = frozenset(submodules)

    def __getattr__(name: str) -> Any:  # noqa: N807 - the module hook's own name
        if name in exports:
            module, _, defined_as = exports[name].partition(":")
            value = getattr(importlib.import_module(module), defined_as or name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)  # once imported, an ordinary attribute
        return value

    def __dir__() -> list[str]:  # noqa: N807
        return sorted(set(vars(sys.modules[package])) | set(exports) | submodules)

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
