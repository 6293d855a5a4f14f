"""specformer's fine-tuning plugin: adapters (a registry kind ``adapter``, with ``lora``), adapter checkpoints,
chat data with loss masking, ``specformer merge``, and PEFT interop (``specformer peft``).

::

    from specformer_finetune import apply_adapter, merge_adapter
    apply_adapter(model, {"kind": "lora", "rank": 8, "alpha": 16, "targets": ["blocks.*.mixer.qkv"]})
    ...                                   # train: only the adapter's tensors require gradients
    merge_adapter(model)                  # fold B @ A * alpha / rank into the base weights, in place

Chat templates, which the chat data is rendered with, are :mod:`specformer_text`'s, shared
with the plugins that talk to a chat model (generate, chat, serve).

Names are imported on first use, so loading the plugin (which every ``specformer``
command does) imports nothing heavy.
"""

from __future__ import annotations

from specformer.lazy import lazy_exports

_EXPORTS = {
    "adapter_of": "specformer_finetune.apply",
    "apply_adapter": "specformer_finetune.apply",
    "merge_adapter": "specformer_finetune.apply",
    "export_peft": "specformer_finetune.peft_io",
    "import_peft": "specformer_finetune.peft_io",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
