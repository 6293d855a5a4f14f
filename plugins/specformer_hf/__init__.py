"""specformer's Hugging Face plugin: import and export checkpoints of the major decoder families.

::

    import specformer_hf
    model = specformer_hf.from_hf("path/to/hf_dir")       # a specformer.Decoder, logits identical
    specformer_hf.to_hf(model, "path/to/out_dir")          # transformers loads it back

On the command line: ``specformer hf import DIR OUT.safetensors`` and
``specformer hf export CHECKPOINT DIR``. A plugin adds a family with the
``specformer_hf_register_families`` hook (see :mod:`specformer_hf.hookspecs`).

The weight-rule walk is public for plugins that convert more than weights (the
fine-tuning plugin's PEFT interop): :func:`choose_family` picks the family of a
:class:`SpecView`, and each family's :class:`Rule` objects map names and tensors at a
:class:`Site` (the model and a layer).

Names are imported on first use, so loading the plugin (which every ``specformer``
command does) imports nothing heavy.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

from specformer_hf.hookspecs import hookimpl

_EXPORTS = {
    "ConfigReader": "specformer_hf.config",
    "choose_family": "specformer_hf.exporter",
    "to_hf": "specformer_hf.exporter",
    "Families": "specformer_hf.family",
    "Family": "specformer_hf.family",
    "get_families": "specformer_hf.family",
    "Imported": "specformer_hf.importer",
    "from_hf": "specformer_hf.importer",
    "import_hf": "specformer_hf.importer",
    "Copy": "specformer_hf.rules",
    "Fused": "specformer_hf.rules",
    "HeadInterleavedQKV": "specformer_hf.rules",
    "PerExpert": "specformer_hf.rules",
    "Rule": "specformer_hf.rules",
    "Site": "specformer_hf.rules",
    "Transposed": "specformer_hf.rules",
    "NotExpressible": "specformer_hf.specview",
    "SpecView": "specformer_hf.specview",
}

__all__ = sorted([*_EXPORTS, "hookimpl"])


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
