"""What the fine-tuning plugin does inside ``specformer train`` (through the train plugin's hooks).

- Before the optimizer is made, ``train.adapter`` is applied to the model loaded from
  ``train.init`` (the base is frozen, so the optimizer only sees the adapter's tensors)
  and the base checkpoint's path and SHA-256 are recorded.
- Each checkpoint's ``model.safetensors`` then stores the adapter's tensors only, with the
  adapter header (:mod:`specformer_finetune.adapter_file`): ``generate``, ``eval``,
  ``merge`` and ``hf export`` read it directly, and the run's final ``model.safetensors``
  is one too.
- On ``--resume`` the stored adapter tensors are completed with the base weights the run
  loaded again from ``train.init``.
"""

from __future__ import annotations

from typing import Any

from specformer.checkpoint import read_metadata
from specformer.errors import CheckpointError, UserError
from specformer_finetune.adapter_file import adapter_metadata, base_reference
from specformer_finetune.apply import adapter_of, adapter_state, apply_adapter, is_adapter_tensor


def prepare_model(model: Any, config: Any, init: str | None) -> None:
    adapter = getattr(config, "adapter", None)
    if adapter is None:
        return
    if init is None:  # the config refuses it too; a direct caller may not have gone through it
        raise UserError("train.adapter trains on a base model's weights: set train.init (or --init)")
    try:
        info = apply_adapter(model, adapter)
    except ValueError as exc:  # a target matching no linear layer
        raise UserError(f"train.adapter: {exc}") from None
    info.base = base_reference(init)


def saved_weights(model: Any, weights: dict[str, Any], path: str) -> tuple[dict[str, Any], dict[str, str]] | None:
    if adapter_of(model) is None:
        return None
    kept = {name: t for name, t in weights.items() if is_adapter_tensor(model, name)}
    base = adapter_of(model).base
    return kept, adapter_metadata(model, path, read_metadata(base["path"]) if base else None)


def resumed_weights(model: Any, weights: dict[str, Any]) -> dict[str, Any] | None:
    if adapter_of(model) is None:
        return None
    expected = set(adapter_state(model))
    if set(weights) != expected:
        other = sorted(set(weights) ^ expected)
        raise CheckpointError(f"the checkpoint does not hold this run's adapter (differs in {', '.join(other[:4])}"
                              f"{' ...' if len(other) > 4 else ''}); resume with the adapter the run started with")
    return {**model.state_dict(), **weights}
