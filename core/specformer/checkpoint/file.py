"""The checkpoint file: one ``.safetensors`` file whose header metadata carries the spec.

Reading and writing the file itself, and nothing about models: the header's format
tag and metadata, the tensors, and atomic writes. :mod:`specformer.checkpoint.check`
checks a header against its spec and :mod:`specformer.checkpoint.save_load` saves and loads
models on top of both.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specformer.checkpoint.locate import resolve_checkpoint
from specformer.files.atomic import replacing
from specformer.files.datafile import path_kind
from specformer.errors import CheckpointError, InputError, excerpt
from specformer.renamed import current_name

FORMAT = "specformer-checkpoint/1"


def write_safetensors_atomic(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    """Write a safetensors file through :func:`specformer.files.atomic.replacing` (complete or absent, umask's mode)."""
    with replacing(Path(path)) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)


def read_metadata(path: str | Path) -> dict[str, str]:
    """The header metadata of a checkpoint (a file, or a directory standing for one: see
    :func:`~specformer.checkpoint.locate.resolve_checkpoint`); CheckpointError if it is not one."""
    path = resolve_checkpoint(path)
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
    """Every tensor of the file by its name as it is now: one stored before a rename (``blocks.0.attention.qkv.weight``)
    reads as ``blocks.0.mixer.qkv.weight`` (:func:`~specformer.renamed.current_name`)."""
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            return {current_name(name): f.get_tensor(name) for name in f.keys()}
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read tensors ({type(exc).__name__}: {exc})") from None


__all__ = ["FORMAT", "read_metadata", "read_tensors", "write_safetensors_atomic"]
