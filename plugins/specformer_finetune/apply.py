"""Putting an adapter on a model, reading its tensors back, and folding it into the base weights.

:func:`apply_adapter` resolves an ``adapter`` component (``{"kind": "lora", ...}``),
optionally stores the base weights at lower precision (the ``quantization`` kind, via the
quant plugin), freezes every base parameter and wraps each target linear layer with the
component's module. The model then carries an :class:`AdapterInfo` as ``model.adapter``:
what was applied (the component reference and the wrapped layers) and, once known, the
base checkpoint it sits on. A wrapped module keeps the original layer as ``.base`` and
answers ``delta_weight()`` (the ``(out, in)`` change to the base weight), which is all
merging needs, so another adapter (DoRA, ...) only has to provide that module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from specformer.registry.params import resolve_component
from specformer_quant import quantize

from specformer_finetune.frozen import freeze_quantized
from specformer_finetune.targets import select_targets

KIND = "adapter"


@dataclass
class AdapterInfo:
    """What an adapted model carries as ``model.adapter``."""

    ref: dict[str, Any]  # {"kind": "lora", "rank": ..., ...}: the component as a spec writes it
    targets: list[str]  # the wrapped linear layers' module paths
    base: dict[str, Any] | None = None  # {"path": ..., "sha256": ...}: the base checkpoint, when known
    quantization: dict[str, Any] | None = field(default=None)  # the base's quantization recipe, when held lower

    def to_json(self) -> dict[str, Any]:
        return {"adapter": self.ref, "targets": self.targets, "base": self.base}


def resolve_adapter(ref: Any, *, path: str = "train.adapter") -> Any:
    """The adapter component ``ref`` names, made; SpecError naming each bad field under ``path``."""
    if hasattr(ref, "make") and hasattr(ref, "component"):  # already resolved by the spec's validation
        return ref.make()
    return resolve_component(KIND, ref, path=path).make()


def apply_adapter(model: nn.Module, ref: Any, *, quantize_base: bool = True, path: str = "train.adapter") -> AdapterInfo:
    """Freeze ``model`` and wrap its target layers with the adapter ``ref`` names (in place); the AdapterInfo.

    ``quantize_base=False`` ignores the component's ``base`` setting (merging wants float weights).
    ``path`` is where ``ref`` was written, for the messages about it (``train.adapter``, or
    ``adapter`` in an adapter checkpoint's header).
    """
    if getattr(model, "adapter", None) is not None:
        raise ValueError("the model already has an adapter; merge it first (specformer merge) to stack another")
    adapter = resolve_adapter(ref, path=path)
    spec_form = ref.to_dict() if hasattr(ref, "to_dict") else {"kind": adapter.name, **adapter.params.model_dump(mode="json")}
    targets = select_targets(model, list(adapter.params.targets))
    recipe = None
    base = getattr(adapter.params, "base", None)
    if quantize_base and base is not None:
        recipe = quantize(model, base.to_dict() if hasattr(base, "to_dict") else base)
        freeze_quantized(model)  # the quantized kernels have no backward: give the inputs their gradient
    for param in model.parameters():
        param.requires_grad_(False)
    for name in targets:
        owner, _, leaf = name.rpartition(".")
        parent = model.get_submodule(owner) if owner else model
        setattr(parent, leaf, adapter.wrap(getattr(parent, leaf)))
    info = AdapterInfo(ref=spec_form, targets=targets, quantization=recipe)
    model.adapter = info  # type: ignore[attr-defined]
    return info


def adapter_of(model: nn.Module) -> AdapterInfo | None:
    """The model's AdapterInfo, or None when it has no adapter."""
    return getattr(model, "adapter", None)


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's own tensors by their names in the model (``blocks.0.mixer.qkv.lora_A``), not the base's."""
    info = _require(model)
    out: dict[str, torch.Tensor] = {}
    for name in info.targets:
        for key, tensor in model.get_submodule(name).state_dict().items():
            if not key.startswith("base."):
                out[f"{name}.{key}"] = tensor
    return out


def is_adapter_tensor(model: nn.Module, name: str) -> bool:
    info = adapter_of(model)
    if info is None:
        return False
    return any(name.startswith(f"{t}.") and not name.startswith(f"{t}.base.") for t in info.targets)


def merge_adapter(model: nn.Module) -> nn.Module:
    """Fold every wrapped layer into a plain ``nn.Linear`` (base weight + delta), in place; the model, adapter-free.

    The base must be held in float (apply with ``quantize_base=False``), so the merged
    weights are the exact sum.
    """
    info = _require(model)
    if info.quantization is not None:
        raise ValueError("the base weights are quantized; load the adapter on a float base to merge it")
    for name in info.targets:
        wrapped = model.get_submodule(name)
        base = wrapped.base
        merged = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None,
                           device=base.weight.device, dtype=base.weight.dtype)
        with torch.no_grad():
            merged.weight.copy_(base.weight + wrapped.delta_weight().to(base.weight.dtype))
            if base.bias is not None:
                merged.bias.copy_(base.bias)
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, leaf, merged)
    for param in model.parameters():
        param.requires_grad_(True)
    del model.adapter
    return model


def count_parameters(model: nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (a quantized base weight counts its logical size)."""
    seen: set[int] = set()
    trainable = total = 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    from_quantized = sum(m.numel() for m in model.modules() if type(m).__name__.endswith("Weight")
                         and hasattr(m, "dequantize"))
    return trainable, total + from_quantized


def _require(model: nn.Module) -> AdapterInfo:
    info = adapter_of(model)
    if info is None:
        raise ValueError("the model has no adapter")
    return info
