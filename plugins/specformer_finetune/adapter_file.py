"""Adapter checkpoints: the adapter's tensors only, plus where its base checkpoint is and what it held.

An adapter checkpoint is a specformer checkpoint file (format tag, the base's spec,
tokenizer and Hugging Face entries copied from the base's header) whose tensors are the
adapter's alone (``blocks.0.mixer.qkv.lora_A``, ...). The header entry ``adapter``
records the component (``{"kind": "lora", "rank": 8, ...}``), the wrapped layers and the
base: its path (absolute, and relative to the adapter file so a moved pair still loads)
and the SHA-256 of its bytes. Core reads such a file through the two checkpoint hooks:
the layout is the base's (so the spec is checked against real weights), and loading
builds the base, checks its hash, applies the adapter and loads the adapter's tensors.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

import specformer
from specformer.checkpoint.check import TensorInfo, check_checkpoint, first_bad_module_path, spec_data
from specformer.checkpoint.file import read_metadata, read_tensors
from specformer.errors import CheckpointError, SpecError, excerpt, problems_line
from specformer.renamed import current_name
from specformer.spec.shapes import ModelSpec
from specformer_finetune.apply import AdapterInfo, adapter_of, adapter_state, apply_adapter, resolve_adapter

#: The header entry of an adapter checkpoint.
ADAPTER_KEY = "adapter"
#: Header entries of the base copied into an adapter checkpoint (tokenizer, Hugging Face configs).
COPIED_KEYS = ("tokenizer", "hf.model_type", "hf.config", "hf.generation_config", "hf.tokenizer_config")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


def base_reference(base_path: str | Path) -> dict[str, Any]:
    """What an adapter records of its base checkpoint: its absolute path and content hash."""
    path = Path(base_path).resolve()
    return {"path": str(path), "sha256": file_sha256(path)}


class _AdapterWeights:
    """What :func:`specformer.save` needs: the base's spec and the adapter's tensors only."""

    def __init__(self, model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        self.spec = model.spec
        self._tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._tensors


def adapter_header(info: AdapterInfo, where: Path) -> dict[str, str]:
    """The header entry for an adapter saved at ``where`` (the base path also relative to it)."""
    if info.base is None:
        raise ValueError("the adapter has no base checkpoint recorded; save the base first and set model.adapter.base")
    record = info.to_json()
    record["base"] = {**info.base, "relative": os.path.relpath(info.base["path"], Path(where).resolve().parent)}
    return {ADAPTER_KEY: json.dumps(record, sort_keys=True)}


def adapter_metadata(model: torch.nn.Module, where: str | Path, base_metadata: dict[str, str] | None = None) -> dict[str, str]:
    """Every header entry an adapter checkpoint of ``model`` at ``where`` needs (beyond format and spec)."""
    info = adapter_of(model)
    assert info is not None
    kept = {k: v for k, v in (base_metadata or {}).items() if k in COPIED_KEYS}
    return {**kept, **adapter_header(info, Path(where))}


def save_adapter(model: torch.nn.Module, path: str | Path, *, metadata: dict[str, str] | None = None) -> Path:
    """Write ``model``'s adapter (tensors and header) to ``path`` atomically."""
    info = adapter_of(model)
    if info is None:
        raise ValueError("the model has no adapter to save")
    base_metadata = read_metadata(info.base["path"]) if info.base else {}
    header = {**adapter_metadata(model, path, base_metadata), **(metadata or {})}
    tensors = {k: v.detach() for k, v in adapter_state(model).items()}
    return specformer.save(_AdapterWeights(model, tensors), path, metadata=header)


def read_record(metadata: dict[str, str], where: str) -> dict[str, Any] | None:
    """The header's adapter record (None for any other checkpoint); CheckpointError when it is unusable."""
    text = metadata.get(ADAPTER_KEY)
    if text is None:
        return None
    try:
        record = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise CheckpointError(f"{where}: the adapter entry in the header is not valid JSON") from None
    base = record.get("base") if isinstance(record, dict) else None
    targets = record.get("targets") if isinstance(record, dict) else None
    if not (isinstance(record, dict) and isinstance(record.get("adapter"), dict) and isinstance(targets, list)
            and all(isinstance(t, str) for t in targets)
            and isinstance(base, dict) and isinstance(base.get("path"), str) and isinstance(base.get("sha256"), str)):
        raise CheckpointError(f"{where}: the adapter entry must hold 'adapter', 'targets' (a list of layer names) and "
                              f"'base' (path and sha256), got {excerpt(record)}")
    bad = first_bad_module_path(targets)
    if bad is not None:
        raise CheckpointError(f"{where}: the adapter entry's 'targets' lists {excerpt(bad)}, which is not a layer name "
                              f"(dotted names of letters, digits and _, as blocks.0.mixer.qkv)")
    record["targets"] = [current_name(t) for t in targets]  # layers named before a rename, as they are now
    try:  # checked here, so that summary refuses what load would: each bad field on the one line
        resolve_adapter(record["adapter"], path=ADAPTER_KEY)
    except SpecError as exc:
        raise CheckpointError(f"{where}: the adapter entry in the header is not an adapter this installation can "
                              f"apply: {problems_line(exc.problems)}") from None
    return record


def base_path(record: dict[str, Any], where: str) -> Path:
    """The base checkpoint: beside the adapter as recorded relative to it, else at its absolute path."""
    base = record["base"]
    relative = base.get("relative")
    candidates = ([Path(where).resolve().parent / relative] if isinstance(relative, str) else []) + [Path(base["path"])]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise CheckpointError(f"{where}: an adapter checkpoint whose base checkpoint {base['path']} is not there "
                          f"(nor at {candidates[0]}); put the base back or merge the adapter where both are")


def _model_of(path: str | Path, metadata: dict[str, str]) -> Any:
    """The ``model`` section of a checkpoint's spec with every default filled in (as stored where it does not parse)."""
    model = spec_data(path, metadata).get("model")
    try:
        return ModelSpec.model_validate(model).model_dump(mode="json")
    except ValidationError:
        return model


def float_layout(metadata: dict[str, str], tensors: dict[str, TensorInfo], where: str) -> dict[str, TensorInfo] | None:
    """The base's layout, for an adapter checkpoint (its spec is checked against the base's weights); else None."""
    record = read_record(metadata, where)
    if record is None:
        return None
    path = base_path(record, where)
    base = check_checkpoint(path)
    # Compared as read now, defaults filled: an adapter saved after a rename (or after a field
    # was added to the spec) sits on a base saved before it.
    if _model_of(path, base.metadata) != _model_of(where, metadata):
        raise CheckpointError(f"{where}: the adapter's spec describes another model than its base {path}")
    targets = record["targets"]
    stray = [n for n in tensors if not any(n.startswith(f"{t}.") for t in targets)]
    if stray:
        raise CheckpointError(f"{where}: tensors {', '.join(sorted(stray)[:5])} belong to no adapted layer "
                              f"({', '.join(targets[:5])}{' ...' if len(targets) > 5 else ''})")
    return dict(base.tensors)


def load_adapted(checked: Any, device: Any, *, quantize_base: bool = True, verify: bool = True) -> Any:
    """The base model with the adapter of an adapter checkpoint applied and loaded; None for any other checkpoint."""
    where = str(checked.path)
    record = read_record(checked.metadata, where)
    if record is None:
        return None
    path = base_path(record, where)
    if verify:
        digest = file_sha256(path)
        if digest != record["base"]["sha256"]:
            raise CheckpointError(f"{where}: its base checkpoint {path} has changed since the adapter was trained "
                                  f"(SHA-256 {digest[:12]}..., recorded {record['base']['sha256'][:12]}...); an "
                                  f"adapter only fits the exact weights it was trained on")
    model = specformer.load(path)
    try:
        info = apply_adapter(model, record["adapter"], quantize_base=quantize_base, path=ADAPTER_KEY)
    except SpecError as exc:
        raise CheckpointError(f"{where}: the adapter cannot be applied to its base: {problems_line(exc.problems)}") from None
    except Exception as exc:  # targets that match no layer of the base
        raise CheckpointError(f"{where}: the adapter cannot be applied to its base: {exc}") from None
    if info.targets != record["targets"]:
        raise CheckpointError(f"{where}: the adapter's targets select other layers of the base than were recorded")
    info.base = {"path": str(path.resolve()), "sha256": record["base"]["sha256"]}
    stored = read_tensors(checked.path)
    expected = adapter_state(model)
    problems = sorted(set(expected) ^ set(stored))
    shaped = sorted(n for n in set(expected) & set(stored) if expected[n].shape != stored[n].shape)
    if problems or shaped:
        raise CheckpointError(f"{where}: the adapter's tensors do not fit the adapter it describes (missing or "
                              f"unexpected: {problems[:5] or 'none'}; mis-shaped: {shaped[:5] or 'none'})")
    with torch.no_grad():
        for name, tensor in stored.items():
            owner, _, leaf = name.rpartition(".")
            getattr(model.get_submodule(owner), leaf).copy_(tensor)
    return model.to(device)
