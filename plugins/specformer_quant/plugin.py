"""Hook implementations of the quantization plugin: the ``quantization`` kind and its schemes, quantized
checkpoints, and the ``specformer quantize`` command."""

from __future__ import annotations

from typing import Any

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry

from specformer_quant.params import Bf16Params, Int4Params, Int8Params


@hookimpl
def specformer_add_kinds(registry: PluginRegistry) -> None:
    registry.add_kind("quantization", doc="How weights are stored and multiplied at lower precision (int8, int4, bf16).")


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    # By factory path: listing the schemes and checking a spec import no torch.
    for name, factory, params, paper in (
            ("int8", "int8:Int8", Int8Params, "Dettmers et al. 2022, LLM.int8()"),
            ("int4", "int4:Int4", Int4Params, "Frantar et al. 2022, GPTQ (group-wise)"),
            ("bf16", "bf16:Bf16", Bf16Params, None)):
        registry.register("quantization", name, factory=f"specformer_quant.{factory}", params=params, paper=paper)


@hookimpl
def specformer_checkpoint_layout(metadata: dict[str, str], tensors: dict[str, Any], where: str) -> Any:
    from specformer_quant.checkpoint import float_layout  # late: imports torch; loading the plugin must not

    return float_layout(metadata, tensors, where)


@hookimpl
def specformer_load_checkpoint(checked: Any, device: Any) -> Any:
    from specformer_quant.checkpoint import load_quantized  # late: imports torch, as above

    return load_quantized(checked, device)


@hookimpl
def specformer_register_commands(commands: Any) -> None:
    from specformer_quant.cli import configure  # late: only a command line needs the parser

    commands.add("quantize", help="Write a checkpoint with int8, int4 or bf16 weights (the recipe in its header).",
                 configure=configure, run="specformer_quant.quantize_command:run")
