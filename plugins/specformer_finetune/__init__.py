"""specformer's fine-tuning plugin: adapters (a registry kind ``adapter``, with ``lora``), adapter checkpoints,
chat templates and chat data with loss masking, ``specformer merge``, and PEFT interop.

::

    from specformer_finetune import apply_adapter, merge_adapter
    apply_adapter(model, {"kind": "lora", "rank": 8, "alpha": 16, "targets": ["blocks.*.attention.qkv"]})
    ...                                   # train: only the adapter's tensors require gradients
    merge_adapter(model)                  # fold B @ A * alpha / rank into the base weights, in place
"""

from __future__ import annotations

from specformer_finetune.apply import adapter_of, apply_adapter, merge_adapter

__all__ = ["adapter_of", "apply_adapter", "merge_adapter"]
