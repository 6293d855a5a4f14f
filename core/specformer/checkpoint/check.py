"""Checking a checkpoint against its own header before allocating anything.

A checkpoint is described only by its own contents: the ``format`` tag and the
``spec`` (a JSON mapping) in its safetensors header, and the names, dtypes and shapes
of its tensors, which the safetensors header lists without any tensor being read.
:func:`check_checkpoint` compares the spec's model (its shapes computed on the meta
device, :mod:`specformer.model.sizes`) with those tensors, so that a 3 MB file whose spec
claims 30 billion parameters, a spec that does not match its weights, or integer
tensors posing as float weights are refused in milliseconds, with a message that
names the problem, before :func:`specformer.load` builds the model.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from safetensors import safe_open

from specformer.checkpoint.file import read_metadata
from specformer.checkpoint.locate import resolve_checkpoint
from specformer.files.datafile import check_shape
from specformer.errors import CheckpointError, InputError, SpecError, excerpt
from specformer.spec.layer_groups import overrides_of_layer
from specformer.registry.discovery import get_plugin_manager, get_registry
from specformer.checkpoint.provenance import check_installed
from specformer.model.sizes import SizeEstimate
from specformer.spec.check import CheckedSpec, check_spec
from specformer.renamed import current_name, upgrade_spec
from specformer.spec.shapes import Spec
from specformer.spec.validate import ResolvedModel

#: safetensors dtype names that hold floating-point values, and bytes per element of every dtype.
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"}
DTYPE_BYTES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the safetensors header lists it (nothing read)."""

    dtype: str  # safetensors' name: F32, BF16, I64, BOOL...
    shape: tuple[int, ...]

    @property
    def floating(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * DTYPE_BYTES.get(self.dtype, 1)


@dataclass
class CheckedCheckpoint:
    """A checkpoint whose header, spec and tensor layout agree: safe to build and load."""

    path: Path
    metadata: dict[str, str]
    checked: CheckedSpec  # the stored spec, validated, resolved and sized: what load builds from
    tensors: dict[str, TensorInfo]  # the float layout the spec is checked against
    stored: dict[str, TensorInfo] | None = None  # what the file holds, when a plugin declared another layout

    @property
    def stored_bytes(self) -> int:
        """Bytes of the tensors as stored (smaller than ``tensor_bytes`` for a quantized checkpoint)."""
        return sum(t.nbytes for t in (self.stored if self.stored is not None else self.tensors).values())

    @property
    def spec(self) -> Spec:
        return self.checked.spec

    @property
    def resolved(self) -> ResolvedModel:
        return self.checked.resolved

    @property
    def shape(self) -> SizeEstimate:
        assert self.checked.shape is not None
        return self.checked.shape

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


#: A module's dotted path as a header may name it (``blocks.0.ffn.down``): names of attributes, nothing else.
MODULE_PATH = re.compile(r"[A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)*")


def first_bad_module_path(names: list[Any]) -> Any:
    """The first of ``names`` that is not a module path (a header entry listing layers); None when all are.

    A header is untrusted input: a name holding a line break or a control character would
    otherwise be printed into a one-line error as it is.
    """
    return next((n for n in names if not (isinstance(n, str) and MODULE_PATH.fullmatch(n))), None)


def check_checkpoint(path: str | Path, *, registry: Any = None, metadata: dict[str, str] | None = None,
                     tensors: dict[str, TensorInfo] | None = None) -> CheckedCheckpoint:
    """Every check a checkpoint goes through before its model is allocated; CheckpointError if one fails.

    ``path`` may be a directory standing for a checkpoint (:func:`~specformer.checkpoint.locate.resolve_checkpoint`).
    ``metadata`` and ``tensors``: the header and the tensor list, when they are known already or
    are not one safetensors file's (a sharded training checkpoint's index describes its shards).
    """
    path = resolve_checkpoint(path)
    registry = registry if registry is not None else get_registry()
    metadata = metadata if metadata is not None else read_metadata(path)
    check_installed(metadata, registry, where=str(path))  # "install plugin X", not "unknown norm"
    data = spec_data(path, metadata)
    try:
        checked = check_spec(data, registry=registry)
    except SpecError as exc:
        raise CheckpointError(f"{path}: the spec stored in the checkpoint does not validate here:\n{exc}") from None
    assert checked.shape is not None
    tensors = stored = tensors if tensors is not None else tensor_infos(path)
    # A plugin may declare a stored layout (quantized weights) and say which float layout it stands for.
    declared = get_plugin_manager().hook.specformer_checkpoint_layout(metadata=metadata, tensors=stored, where=str(path))
    if declared is not None:
        tensors = declared
    compare_layout(tensors, checked.resolved, checked.shape, where=str(path))
    return CheckedCheckpoint(path=path, metadata=metadata, checked=checked, tensors=tensors,
                             stored=stored if declared is not None else None)


def spec_data(path: str | Path, metadata: dict[str, str]) -> dict[str, Any]:
    """The spec in a checkpoint header as plain data: a JSON mapping, never anything else (not a path)."""
    text = metadata.get("spec")
    if text is None:
        raise CheckpointError(f"{path}: the checkpoint header has no 'spec' entry; it was not written by specformer.save or is damaged")
    try:
        data = json.loads(text)
        check_shape(data)
    except RecursionError:
        raise CheckpointError(f"{path}: the spec in the header is nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: the spec in the header is not valid JSON ({exc})") from None
    except InputError as exc:
        raise CheckpointError(f"{path}: the spec in the header {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{path}: the spec in the header is a JSON {_json_type(data)} ({excerpt(data)}), not a mapping with a "
            f"'model' section; a checkpoint is described only by its own header"
        )
    try:  # a checkpoint saved before a rename says so once, naming its file
        return upgrade_spec(data, source=str(path))
    except SpecError as exc:
        raise CheckpointError(f"{path}: the spec stored in the checkpoint does not validate here:\n{exc}") from None


def tensor_infos(path: str | Path) -> dict[str, TensorInfo]:
    """Name -> dtype and shape of every tensor, from the safetensors header (no tensor is read).

    Names stored before a rename are given as they are now (:func:`~specformer.renamed.current_name`).
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            out = {}
            for name in f.keys():
                piece = f.get_slice(name)
                out[current_name(name)] = TensorInfo(dtype=str(piece.get_dtype()), shape=tuple(int(d) for d in piece.get_shape()))
            return out
    except Exception as exc:  # safetensors' own error types for a damaged header
        raise CheckpointError(f"{path}: cannot read the tensor list ({type(exc).__name__}: {exc})") from None


def expected_tensors(resolved: ResolvedModel, shape: SizeEstimate) -> Iterator[tuple[str, tuple[int, ...], bool]]:
    """(name, shape, floating?) of every entry of the model's state_dict, from the meta estimate."""
    for name, t in shape.skeleton.state_dict().items():
        yield name, tuple(t.shape), t.is_floating_point()
    by_signature = {
        g.group.overrides: [(n, tuple(t.shape), t.is_floating_point()) for n, t in block.state_dict().items()]
        for g, (block, _count) in zip(resolved.groups, shape.blocks)
    }
    for i in range(resolved.spec.n_layers):
        for name, dims, floating in by_signature[overrides_of_layer(i, resolved.selections)]:
            yield f"blocks.{i}.{name}", dims, floating


def expected_count(shape: SizeEstimate) -> int:
    return len(shape.skeleton.state_dict()) + sum(len(block.state_dict()) * count for block, count in shape.blocks)


def compare_layout(tensors: dict[str, TensorInfo], resolved: ResolvedModel, shape: SizeEstimate, *, where: str) -> None:
    """CheckpointError unless the file holds exactly the model's tensors, with its shapes, as floats where it has floats."""
    count = expected_count(shape)
    if count != len(tensors):
        raise CheckpointError(
            f"{where}: does not match its spec: the spec describes a model of {shape.parameters:,} parameters in "
            f"{count:,} tensors, the file holds {len(tensors):,} tensors"
            + (f" ({sum(t.nbytes for t in tensors.values()):,} bytes)" if count > len(tensors) else "")
        )
    missing, misshaped, not_float = [], [], []
    for name, dims, floating in expected_tensors(resolved, shape):
        info = tensors.get(name)
        if info is None:
            missing.append(name)
            continue
        if info.shape != dims:
            misshaped.append(f"{name} (checkpoint {info.shape}, model {dims})")
        if floating and not info.floating:
            not_float.append(f"{name} ({info.dtype})")
    problems = []
    if missing:
        unexpected = sorted(set(tensors) - {n for n, _, _ in expected_tensors(resolved, shape)})
        problems.append(f"missing tensors: {_few(missing)}")
        if unexpected:
            problems.append(f"unexpected tensors: {_few(unexpected)}")
    if misshaped:
        problems.append(f"mis-shaped tensors: {_few(misshaped)}")
    if not_float:
        problems.append(
            f"tensors that are not floating point where the model has float weights: {_few(not_float)}; "
            "specformer does not cast integer or bool tensors into weights (a quantized checkpoint needs a plugin "
            "that declares its layout)"
        )
    if problems:
        raise CheckpointError(f"{where}: does not match its spec; " + "; ".join(problems))


def _few(items: list[str], limit: int = 8) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _json_type(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean", type(None): "null"}.get(
        type(value), type(value).__name__
    )


__all__ = ["MODULE_PATH", "CheckedCheckpoint", "TensorInfo", "check_checkpoint", "compare_layout", "first_bad_module_path",
           "spec_data", "tensor_infos"]
