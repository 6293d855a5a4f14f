"""specformer's Hugging Face plugin: import and export checkpoints of the major decoder families.

::

    import specformer_hf
    model = specformer_hf.from_hf("path/to/hf_dir")       # a specformer.Decoder, logits identical
    specformer_hf.to_hf(model, "path/to/out_dir")          # transformers loads it back

On the command line: ``specformer hf import DIR OUT.safetensors`` and
``specformer hf export CHECKPOINT DIR``. A plugin adds a family with the
``specformer_hf_register_families`` hook (see :mod:`specformer_hf.hookspecs`).
"""

from __future__ import annotations

from specformer_hf.config import ConfigReader
from specformer_hf.exporter import to_hf
from specformer_hf.family import Families, Family, get_families
from specformer_hf.hookspecs import hookimpl
from specformer_hf.importer import Imported, from_hf, import_hf
from specformer_hf.rules import Copy, Fused, HeadInterleavedQKV, PerExpert, Rule, Site, Transposed
from specformer_hf.specview import NotExpressible, SpecView

__all__ = [
    "ConfigReader",
    "Copy",
    "Families",
    "Family",
    "Fused",
    "HeadInterleavedQKV",
    "Imported",
    "NotExpressible",
    "PerExpert",
    "Rule",
    "Site",
    "SpecView",
    "Transposed",
    "from_hf",
    "get_families",
    "hookimpl",
    "import_hf",
    "to_hf",
]
