"""specformer: decoder-only transformer language models assembled from spec files and plugins.

::

    import specformer
    model = specformer.build("specs/tiny.yaml")
    logits = model(input_ids)                 # (B, T, vocab)
    specformer.save(model, "tiny.safetensors")
    same = specformer.load("tiny.safetensors")

The names below are imported when first used, so ``import specformer`` (and the
``specformer`` command's ``--help``, ``components`` and ``schema``) start without
importing torch. The core's subpackages, each one concept:

- :mod:`specformer.spec`: the spec and its pipeline (shapes, validation, the whole check);
- :mod:`specformer.registry.components`: components, their params, plugin hooks and discovery;
- :mod:`specformer.model`: the runtime (contracts, masks, context, Decoder, build, sizes);
- :mod:`specformer.checkpoint.save_load`: the safetensors file, its checks, save and load;
- :mod:`specformer.tokenizers`: tokenizers stored with checkpoints;
- :mod:`specformer.files`, :mod:`specformer.machine`: safe file I/O; devices, memory, threads;
- :mod:`specformer.cli.main`: the ``specformer`` command;
- :mod:`specformer.errors`, :mod:`specformer.messages`: user errors and how they are worded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specformer.errors import CheckpointError, Problem, RegistryError, SpecError, UserError
from specformer.lazy import lazy_exports
from specformer.version import __version__

#: Public name -> the module that defines it.
_LAZY = {
    "build": "specformer.model.builder",
    "Decoder": "specformer.model.decoder",
    "summarize": "specformer.model.summary",
    "load": "specformer.checkpoint.save_load",
    "save": "specformer.checkpoint.save_load",
    "hookimpl": "specformer.registry.hookspecs",
    "Params": "specformer.registry.params",
    "SubComponent": "specformer.registry.params",
    "get_plugin_manager": "specformer.registry.discovery",
    "get_registry": "specformer.registry.discovery",
    "Spec": "specformer.spec.shapes",
    "load_spec": "specformer.spec",
}
_SUBPACKAGES = {"spec", "registry", "model", "checkpoint", "tokenizers", "files", "machine", "cli", "messages"}

if TYPE_CHECKING:
    from specformer.checkpoint.save_load import load, save
    from specformer.model.builder import build
    from specformer.model.decoder import Decoder
    from specformer.model.summary import summarize
    from specformer.registry.discovery import get_plugin_manager, get_registry
    from specformer.registry.hookspecs import hookimpl
    from specformer.registry.params import Params, SubComponent
    from specformer.spec import load_spec
    from specformer.spec.shapes import Spec


__getattr__, __dir__ = lazy_exports(__name__, _LAZY, submodules=_SUBPACKAGES)


__all__ = [
    "CheckpointError",
    "Decoder",
    "Params",
    "Problem",
    "RegistryError",
    "Spec",
    "SpecError",
    "SubComponent",
    "UserError",
    "__version__",
    "build",
    "get_plugin_manager",
    "get_registry",
    "hookimpl",
    "load",
    "load_spec",
    "save",
    "summarize",
]
