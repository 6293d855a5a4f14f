"""specformer's fine-tuning plugin: adapters (a registry kind ``adapter``, with ``lora``), adapter checkpoints,
chat templates and chat data with loss masking, ``specformer merge``, and PEFT interop.

::

    from specformer_finetune import apply_adapter, merge_adapter
    apply_adapter(model, {"kind": "lora", "rank": 8, "alpha": 16, "targets": ["blocks.*.attention.qkv"]})
    ...                                   # train: only the adapter's tensors require gradients
    merge_adapter(model)                  # fold B @ A * alpha / rank into the base weights, in place

Chat templates, for the plugins that talk to a chat model (generate, chat, serve)::

    from specformer_finetune import render, resolve_template, turn_end
    source, tokens = resolve_template("chatml", metadata)      # a built-in name, a file, or the checkpoint's own
    text = render(source, messages, add_generation_prompt=True, **tokens)
    end = turn_end(source, tokenizer=tokenizer, metadata=metadata)   # ids and strings that end the reply

Rendering is bounded (``render(..., timeout=DEFAULT_TIMEOUT, max_output=DEFAULT_MAX_OUTPUT)``);
``compile_template`` checks a template up front.
"""

from __future__ import annotations

from specformer_finetune.apply import adapter_of, apply_adapter, merge_adapter
from specformer_finetune.chat_template import BUILTIN, TemplateError, compile_template, render, resolve_template, \
    template_from_metadata
from specformer_finetune.template_bounds import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT
from specformer_finetune.turn_end import TurnEnd, turn_end

__all__ = ["BUILTIN", "DEFAULT_MAX_OUTPUT", "DEFAULT_TIMEOUT", "TemplateError", "TurnEnd", "adapter_of", "apply_adapter",
           "compile_template", "merge_adapter", "render", "resolve_template", "template_from_metadata", "turn_end"]
