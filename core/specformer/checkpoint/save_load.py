"""Checkpoints: one ``.safetensors`` file whose header metadata carries the spec.

Never pickle: tensors go through safetensors, everything else through JSON strings in
the header. Writes are atomic (a temporary file renamed over the target), so an
interrupted save leaves the previous checkpoint intact. The file itself is read and
written by :mod:`specformer.checkpoint.file`; its names are re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from specformer.model.builder import build_checked
from specformer.checkpoint.check import check_checkpoint
from specformer.checkpoint.locate import resolve_checkpoint
from specformer.checkpoint.file import FORMAT, read_metadata, read_tensors, write_safetensors_atomic
from specformer.errors import CheckpointError
from specformer.machine.memory import check_memory
from specformer.registry.discovery import get_plugin_manager, get_registry
from specformer.checkpoint.provenance import header_entry
from specformer.version import __version__


def save(model: torch.nn.Module, path: str | Path, *, metadata: dict[str, str] | None = None,
         registry: Any = None) -> Path:
    """Write ``model``'s weights and spec to ``path`` atomically; return the path.

    The header also records which plugin (distribution and version) provided each
    component the spec uses, so that loading where one is missing says what to install.
    """
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ValueError("the model has no .spec; build it with specformer.build() to save it")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    header = {"format": FORMAT, "spec": spec.to_json(), "specformer_version": __version__,
              **header_entry(spec, registry if registry is not None else get_registry()), **(metadata or {})}
    write_safetensors_atomic(tensors, path, header)
    return path


def load(path: str | Path, *, device: str | torch.device = "cpu", registry: Any = None) -> Any:
    """Rebuild the model saved at ``path`` (its spec from the header) and load its weights exactly.

    Before anything is allocated the header is checked against itself
    (:func:`specformer.checkpoint.check.check_checkpoint`: format tag, spec, tensor
    names, shapes and dtypes) and the memory needed against the memory available
    (:mod:`specformer.machine.memory`).
    """
    path = resolve_checkpoint(path)  # a run's step-N directory, or the run directory, stands for its file
    checked = check_checkpoint(path, registry=registry)
    # The model is built in float32, then the file's tensors are read beside it.
    check_memory(checked.shape.total_bytes() + checked.tensor_bytes, what=f"loading {path}", device="cpu")
    # A plugin that declared this checkpoint's layout (quantized weights) loads it itself.
    declared = get_plugin_manager().hook.specformer_load_checkpoint(checked=checked, device=device)
    if declared is not None:
        return declared
    # Allocated once, uninitialised: every stored tensor is about to be copied in.
    model = build_checked(checked.checked, init=False)
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


__all__ = ["FORMAT", "load", "load_weights", "read_metadata", "read_tensors", "save", "write_safetensors_atomic"]
