"""specformer: decoder-only transformer language models assembled from spec files and plugins.

::

    import specformer
    model = specformer.build("specs/tiny.yaml")
    logits = model(input_ids)                 # (B, T, vocab)
    specformer.save(model, "tiny.safetensors")
    same = specformer.load("tiny.safetensors")
"""

from __future__ import annotations

from specformer.model.builder import build
from specformer.checkpoint.save_load import load, save
from specformer.model.decoder import Decoder
from specformer.errors import CheckpointError, Problem, RegistryError, SpecError, UserError
from specformer.registry.hookspecs import hookimpl
from specformer.registry.params import Params, SubComponent
from specformer.registry.discovery import get_plugin_manager, get_registry
from specformer.spec import Spec, load_spec
from specformer.model.summary import summarize
from specformer.version import __version__

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
