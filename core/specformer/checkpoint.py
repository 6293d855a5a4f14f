"""Checkpoints: one ``.safetensors`` file whose header metadata carries the spec.

Never pickle: tensors go through safetensors, everything else through JSON strings in
the header. Writes are atomic (a temporary file renamed over the target), so an
interrupted save leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specformer.datafile import path_kind
from specformer.errors import CheckpointError, InputError, excerpt

FORMAT = "specformer-checkpoint/1"


def save(model: torch.nn.Module, path: str | Path, *, metadata: dict[str, str] | None = None,
         registry: Any = None) -> Path:
    """Write ``model``'s weights and spec to ``path`` atomically; return the path.

    The header also records which plugin (distribution and version) provided each
    component the spec uses, so that loading where one is missing says what to install.
    """
    from specformer import __version__
    from specformer.plugins import get_registry
    from specformer.provenance import header_entry

    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError("the model has no .spec; build it with specformer.build() to save it")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    header = {"format": FORMAT, "spec": spec.to_json(), "specformer_version": __version__,
              **header_entry(spec, registry or get_registry()), **(metadata or {})}
    write_safetensors_atomic(tensors, path, header)
    return path


def write_safetensors_atomic(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_metadata(path: str | Path) -> dict[str, str]:
    """The header metadata of a checkpoint; CheckpointError if it is not one."""
    path = Path(path)
    try:
        found = path_kind(path)
    except InputError as exc:
        raise CheckpointError(str(exc)) from None
    if found == "missing":
        raise CheckpointError(f"{path}: no such checkpoint file")
    if found != "file":
        raise CheckpointError(f"{path}: is {'a directory' if found == 'directory' else found}, not a checkpoint file")
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
    except Exception as exc:  # safetensors raises its own error types for truncated/garbage files
        raise CheckpointError(f"{path}: not a readable safetensors checkpoint ({type(exc).__name__}: {exc})") from None
    found = metadata.get("format")
    if found != FORMAT:
        if found is None:
            detail = "its header has no 'format' entry" + ("" if "spec" in metadata else " and no 'spec'")
        elif str(found).startswith("specformer-checkpoint/"):
            detail = f"its format is {excerpt(found)}, which this version of specformer does not read"
        else:
            detail = f"its header says format {excerpt(found)}"
        raise CheckpointError(f"{path}: a safetensors file but not a specformer checkpoint ({detail}; expected format {FORMAT!r})")
    if "spec" not in metadata:
        raise CheckpointError(
            f"{path}: a specformer checkpoint header without its 'spec' entry; the file is damaged or was not written by specformer.save"
        )
    return metadata


def read_tensors(path: str | Path, *, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            return {name: f.get_tensor(name) for name in f.keys()}
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read tensors ({type(exc).__name__}: {exc})") from None


def load(path: str | Path, *, device: str | torch.device = "cpu", registry: Any = None) -> Any:
    """Rebuild the model saved at ``path`` (its spec from the header) and load its weights exactly.

    Before anything is allocated the header is checked against itself
    (:func:`specformer.checkpoint_check.check_checkpoint`: format tag, spec, tensor
    names, shapes and dtypes) and the memory needed against the memory available
    (:mod:`specformer.memory`).
    """
    from specformer.builder import build
    from specformer.checkpoint_check import check_checkpoint
    from specformer.memory import check_memory

    checked = check_checkpoint(path, registry=registry)
    # The model is built in float32, then the file's tensors are read beside it.
    check_memory(checked.shape.total_bytes() + checked.tensor_bytes, what=f"loading {path}", device="cpu")
    model = build(checked.spec, registry=registry)
    tensors = read_tensors(path)
    load_weights(model, tensors, where=str(path))
    return model.to(device)


def load_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor], *, where: str) -> None:
    """Copy ``tensors`` into ``model``; name every missing, unexpected or mis-shaped tensor."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    misshaped = sorted(
        f"{name} (checkpoint {tuple(tensors[name].shape)}, model {tuple(expected[name].shape)})"
        for name in set(expected) & set(tensors)
        if tensors[name].shape != expected[name].shape
    )
    problems = []
    if missing:
        problems.append(f"missing tensors: {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected tensors: {', '.join(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped tensors: {', '.join(misshaped)}")
    not_float = sorted(
        f"{name} ({tensors[name].dtype})"
        for name in set(expected) & set(tensors)
        if expected[name].is_floating_point() and not tensors[name].is_floating_point()
    )
    if not_float:
        problems.append(
            f"tensors that are not floating point where the model has float weights: {', '.join(not_float)}; "
            "specformer does not cast integer or bool tensors into weights"
        )
    if problems:
        raise CheckpointError(f"{where}: does not match its spec; " + "; ".join(problems))
    dtypes = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(dtypes) == 1:
        model.to(dtype=dtypes.pop())  # keep the saved precision so the round trip is bit-exact
    model.load_state_dict(tensors, strict=True)
