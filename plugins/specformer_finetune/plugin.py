"""Hook implementations of the fine-tuning plugin: the ``adapter`` kind and ``lora``, adapter checkpoints,
the ``merge`` command, and the train hooks that apply an adapter and save it."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry

from specformer_finetune.params import LoRAParams


@hookimpl
def specformer_add_kinds(registry: PluginRegistry) -> None:
    registry.add_kind("adapter", doc="Trainable additions to a frozen model's linear layers (LoRA), for fine-tuning.")


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    # By factory path: listing adapters and checking a spec import no torch.
    registry.register("adapter", "lora", factory="specformer_finetune.lora:LoRA", params=LoRAParams,
                      paper="Hu et al. 2021, LoRA: Low-Rank Adaptation of Large Language Models")


@hookimpl
def specformer_checkpoint_layout(metadata: dict[str, str], tensors: dict[str, Any], where: str) -> Any:
    from specformer_finetune.adapter_file import float_layout  # late: imports torch; loading the plugin must not

    return float_layout(metadata, tensors, where)


@hookimpl
def specformer_load_checkpoint(checked: Any, device: Any) -> Any:
    from specformer_finetune.adapter_file import load_adapted  # late: imports torch, as above

    return load_adapted(checked, device)


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_finetune import merge_cli, peft_cli  # late: only a command line builds these parsers

    commands.add("merge", help="Fold an adapter checkpoint into its base: a plain checkpoint (W + B @ A * alpha / rank).",
                 configure=merge_cli.configure, run=merge_cli.run)
    commands.add("peft", help="Write an adapter checkpoint as a PEFT LoRA folder, or import one onto its base.",
                 configure=peft_cli.configure, run=peft_cli.run)


# -- the train plugin's hooks: apply train.adapter, save only its tensors, complete them on resume --------------


@hookimpl
def specformer_train_prepare_model(model: Any, config: Any, init: str | None) -> None:
    from specformer_finetune.training import prepare_model  # late: imports torch, as above

    prepare_model(model, config, init)


@hookimpl
def specformer_train_saved_weights(model: Any, weights: dict[str, Any], path: str) -> Any:
    from specformer_finetune.training import saved_weights  # late: imports torch, as above

    return saved_weights(model, weights, path)


@hookimpl
def specformer_train_resumed_weights(model: Any, weights: dict[str, Any]) -> Any:
    from specformer_finetune.training import resumed_weights  # late: imports torch, as above

    return resumed_weights(model, weights)


@hookimpl
def specformer_train_rows(config: Any, tokenizer: Any, seq_len: int, metadata: dict[str, str] | None,
                          vocab_size: int) -> Any:
    from specformer_finetune.training import chat_rows  # late: imports torch, as above

    return chat_rows(config, tokenizer, seq_len=seq_len, metadata=metadata, vocab_size=vocab_size)
