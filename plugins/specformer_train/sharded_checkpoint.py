"""Sharded checkpoints (``train.checkpoint_format: sharded``): every process writes its own share, nothing is gathered.

A sharded checkpoint directory holds, beside ``trainer.json``, ``tokenizer.json`` and the
``rng-rank<R>.safetensors`` files every checkpoint has,

- ``shard-rank<R>.safetensors``, one per process: the blocks of the model's and the
  optimizer's tensors that process holds, each keyed ``<name>@<offsets>``; the header's
  ``slices`` entry (JSON) says for each key which tensor it is a block of and where the
  block starts in it (``name`` is ``model/<parameter>`` or ``optimizer/<parameter>/<state>``);
- ``sharded.json`` (written by the first process): the format, every tensor's global shape
  and dtype, the shard files, the optimizer's class, parameter groups and non-tensor state,
  and the header a consolidated ``model.safetensors`` gets (the spec, the tokenizer).

Nothing is pickled: torch.distributed.checkpoint's own writer records its metadata with
pickle, so the model and optimizer state dicts are taken with its ``get_*_state_dict``
(sharded DTensors under FSDP2 and tensor parallelism) and written here, block by block.

The stored coordinates are the module's own, whatever the mesh: a block is a rectangle of
the tensor as :func:`specformer.load` would see it. A DTensor's local rows are found by
splitting the global index ranges the way its placements do (``_StridedShard`` included:
FSDP2 beside tensor parallelism), then, for a fused projection split by tensor parallelism
(rows rank-major, :mod:`specformer.model.tensor_parallel`), mapped through its row order
to the module's rows; the local tensor is cut into maximal runs of consecutive rows (three
blocks for a process' q, k and v rows). Reading does the same on the new mesh and copies
from each stored block what overlaps, so a checkpoint resumes on any number of processes
and any layout, and :func:`consolidate` makes the single file without torch.distributed.

A copy of a tensor that several processes hold (replicated weights, DDP) is written once:
by the processes of the sub-mesh that contains rank 0, at coordinate 0 of every mesh
dimension the tensor is replicated on.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import safe_open
from torch import Tensor, nn

from specformer.checkpoint.check import TensorInfo, check_checkpoint
from specformer.checkpoint.file import FORMAT, write_safetensors_atomic
from specformer.checkpoint.provenance import header_entry
from specformer.errors import UserError
from specformer.files.atomic import write_text_atomic
from specformer.registry.discovery import get_registry
from specformer.renamed import current_name
from specformer.tokenizers.tokenizer import METADATA_KEY
from specformer.version import __version__

from specformer_train.checkpoint_files import DamagedCheckpoint, parse_json, read_json, refuse_misfit
from specformer_train.optimizer_state import current_groups, current_slots, state_problems
from specformer_train.parallel.placement import global_indices

INDEX = "sharded.json"
SHARDED_FORMAT = "specformer-sharded-checkpoint/1"
MODEL, OPTIMIZER = "model/", "optimizer/"
#: The dtypes a tensor may have (torch's names, as the index records them), each with the name a shard's
#: safetensors header gives it: a block must be stored in its tensor's dtype, never cast.
STORED_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "float8_e4m3fn": "F8_E4M3",
                 "float8_e5m2": "F8_E5M2", "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
                 "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL"}


def shard_file(rank: int) -> str:
    return f"shard-rank{rank:05d}.safetensors"


def is_sharded(path: Path) -> bool:
    return (Path(path) / INDEX).is_file()


def use_sharded(requested: str, *, mode: str, tp: int, adapter: bool, ep: int = 1) -> bool:
    """Whether this run's checkpoints are sharded (``train.checkpoint_format``); an adapter run's, and an expert-parallel
    run's, cannot be."""
    sharded = requested == "sharded" or (requested == "auto" and (mode == "fsdp" or tp > 1))
    if sharded and adapter:
        if requested == "auto":
            return False  # an adapter checkpoint is small: the full format stores it with its base's reference
        raise UserError("train.checkpoint_format sharded does not store adapter runs (train.adapter): their "
                        "checkpoints hold the adapter and a reference to the base; use full or auto")
    if sharded and ep > 1:
        # Each process holds its experts as plain tensors, which this format takes for copies written once.
        if requested == "auto":
            return False
        raise UserError(f"train.checkpoint_format sharded does not store expert-parallel runs (train.parallel.ep {ep}) "
                        f"yet: each process' experts are its own; use full or auto")
    return sharded


def module_shape(tensor: Tensor, row_order: Tensor | None) -> list[int]:
    """The (global) shape of ``tensor`` in the module's rows: fewer than gathered when units are copied."""
    shape = list(tensor.shape)
    if row_order is not None and shape and shape[0] == len(row_order):
        shape[0] = int(row_order.max()) + 1
    return shape


def first_copies(row_order: Tensor) -> Tensor:
    """Per gathered row, whether it is the first in ``row_order`` to stand for its real row."""
    seen: set[int] = set()
    first = []
    for row in row_order.tolist():
        first.append(row not in seen)
        seen.add(row)
    return torch.tensor(first, dtype=torch.bool)


def writes_copy(tensor: Tensor, rank: int) -> bool:
    """Whether this process writes its share of ``tensor`` (each copy of a replicated block is written once)."""
    # late: only distributed runs have DTensors; consolidation never asks
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return rank == 0
    mesh = tensor.device_mesh
    if 0 not in mesh.mesh.flatten().tolist():  # a parallel sub-mesh holding the same as rank 0's
        return False
    coordinate = mesh.get_coordinate()
    return all(coordinate[i] == 0 for i, p in enumerate(tensor.placements) if p.is_replicate() or p.is_partial())


def _runs(index: Tensor) -> list[tuple[int, int, int]]:
    """``(local start, global start, length)`` of each maximal run of consecutive global indices."""
    if len(index) == 0:
        return []
    breaks = ((index[1:] - index[:-1]) != 1).nonzero().reshape(-1) + 1  # where a new run starts
    starts = [0, *breaks.tolist()]
    ends = [*starts[1:], len(index)]
    return [(start, int(index[start]), end - start) for start, end in zip(starts, ends)]


def blocks(local: Tensor, indices: list[Tensor]) -> Iterator[tuple[list[int], Tensor]]:
    """The local tensor cut into rectangles contiguous in global coordinates: ``(global offsets, block)``."""
    per_dim = [_runs(index) for index in indices]
    for combination in _product(per_dim):
        block = local
        for dim, (start, _, length) in enumerate(combination):
            block = block.narrow(dim, start, length)
        yield [g for _, g, _ in combination], block


def _product(lists: list[list[Any]]) -> Iterator[list[Any]]:
    if not lists:
        yield []
        return
    for head in lists[0]:
        for tail in _product(lists[1:]):
            yield [head, *tail]


# -- saving ----------------------------------------------------------------------------------


def write_shards(tmp: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, rank: int,
                 world_size: int, header: dict[str, str]) -> None:
    """This process' ``shard-rank<R>.safetensors`` (every process) and ``sharded.json`` (rank 0) into ``tmp``."""
    # late: torch.distributed.checkpoint is only needed by checkpointing runs
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    from specformer.model.tensor_parallel import fused_row_orders

    options = StateDictOptions(full_state_dict=False)
    model_state = get_model_state_dict(model, options=options)
    optim_state = get_optimizer_state_dict(model, optimizer, options=options)
    orders = fused_row_orders(model)

    named: dict[str, tuple[Tensor, Tensor | None]] = {}  # name -> (tensor, row order)
    for fqn, tensor in model_state.items():
        named[MODEL + fqn] = (tensor, orders.get(fqn))
    scalars: dict[str, Any] = {}
    for fqn, entries in optim_state["state"].items():
        for key, value in entries.items():
            if isinstance(value, Tensor):
                shaped_like = fqn in orders and value.dim() >= 1 and value.shape[0] == len(orders[fqn])
                named[f"{OPTIMIZER}{fqn}/{key}"] = (value, orders[fqn] if shaped_like else None)
            else:
                scalars[f"{fqn}/{key}"] = value

    tensors: dict[str, Tensor] = {}
    slices: dict[str, list[Any]] = {}
    for name, (tensor, order) in named.items():
        if not writes_copy(tensor, rank):
            continue
        indices, local = global_indices(tensor, order)
        if order is not None and len(order) > int(order.max()) + 1:
            # copied key/value heads: several processes hold a row; the first copy in the order writes it
            gathered, _ = global_indices(tensor)
            first = first_copies(order)[gathered[0]]
            indices[0], local = indices[0][first], local[first]
        for offsets, block in blocks(local.detach(), indices):
            key = f"{name}@{','.join(map(str, offsets))}"
            tensors[key] = block.cpu().contiguous().clone()
            slices[key] = [name, offsets]
    write_safetensors_atomic(tensors, tmp / shard_file(rank), {"slices": json.dumps(slices)})

    if rank == 0:
        groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
                  for g in optim_state["param_groups"]]
        index = {
            "format": SHARDED_FORMAT,
            "world_size": world_size,
            "files": [shard_file(r) for r in range(world_size)],
            "tensors": {name: {"shape": module_shape(tensor, order), "dtype": str(tensor.dtype).removeprefix("torch.")}
                        for name, (tensor, order) in named.items()},
            "optimizer": {"class": type(optimizer).__name__, "param_groups": groups, "scalars": scalars},
            "header": header,
        }
        _write_json(tmp / INDEX, index)


def model_header(model: nn.Module, metadata: dict[str, str]) -> dict[str, str]:
    """The header :func:`specformer.save` would give ``model``'s file: what a consolidated file carries."""
    spec = model.spec
    return {"format": FORMAT, "spec": spec.to_json(), "specformer_version": __version__,
            **header_entry(spec, get_registry()), **metadata}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=1))


# -- reading ---------------------------------------------------------------------------------


@dataclass
class Block:
    file: Path
    key: str
    offsets: list[int]
    shape: list[int]


@dataclass
class ShardedIndex:
    """A sharded checkpoint's index and the blocks its shard files hold, checked to cover every tensor."""

    path: Path
    world_size: int
    files: list[Path]  # the shard files, every one of which is read
    shapes: dict[str, list[int]]
    dtypes: dict[str, str]
    blocks: dict[str, list[Block]]
    optimizer: dict[str, Any]
    header: dict[str, str]

    def model_names(self) -> list[str]:
        return [name[len(MODEL):] for name in self.shapes if name.startswith(MODEL)]


def read_index(path: Path) -> ShardedIndex:
    """Read ``sharded.json`` and every shard file's header; :class:`DamagedCheckpoint` names a bad or missing file.

    Everything is checked before any tensor is allocated (the files are untrusted): the
    index's names (``model/``, and ``optimizer/`` naming a stored parameter, see
    :mod:`specformer_train.optimizer_state`), each file listed once, each block's stored
    dtype the index's, and the blocks of every tensor tiling it exactly (:func:`tiling_problem`),
    which also bounds every declared size by the values the shard files hold.
    """
    path = Path(path)
    index_path = path / INDEX
    index = read_json(index_path)
    try:
        if index.get("format") != SHARDED_FORMAT:
            raise DamagedCheckpoint(f"{index_path}: unknown format; expected {SHARDED_FORMAT!r}")
        # Names stored before a rename (model/blocks.0.attention.qkv.weight) are read as they are now.
        shapes = {current_name(str(name)): [int(n) for n in info["shape"]] for name, info in index["tensors"].items()}
        dtypes = {current_name(str(name)): str(info["dtype"]) for name, info in index["tensors"].items()}
        files = [str(f) for f in index["files"]]
        optimizer, header, world_size = dict(index["optimizer"]), dict(index["header"]), int(index["world_size"])
        optimizer.update(scalars=current_slots(optimizer.get("scalars")),
                         param_groups=current_groups(optimizer.get("param_groups")))
        problems = ([f"a negative size in {name}" for name, shape in shapes.items() if any(n < 0 for n in shape)]
                    + [f"dtype {d!r}" for d in dtypes.values() if d not in STORED_DTYPES]
                    + [f"file {f!r}" for f in files if Path(f).name != f]  # shards lie beside the index
                    + [f"file {f!r} listed {files.count(f)} times" for f in sorted(set(files)) if files.count(f) > 1]
                    + [f"tensor {name!r} (neither {MODEL} nor {OPTIMIZER})" for name in shapes
                       if not name.startswith((MODEL, OPTIMIZER))]
                    + [f"header entry {k!r}" for k, v in header.items() if not isinstance(v, str)])
        if not problems:
            weights = {name[len(MODEL):]: shape for name, shape in shapes.items() if name.startswith(MODEL)}
            moments = {name[len(OPTIMIZER):]: (shape, dtypes[name]) for name, shape in shapes.items()
                       if name.startswith(OPTIMIZER)}
            problems = state_problems(moments, optimizer.get("scalars"), weights, optimizer.get("param_groups"))
        if problems:
            raise ValueError(", ".join(problems))
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError) as exc:
        raise DamagedCheckpoint(f"{index_path}: not a sharded checkpoint index ({type(exc).__name__}: {exc})") from None
    if METADATA_KEY in header:  # compared with the run's tokenizer on resume, carried into a consolidated file
        parse_json(header[METADATA_KEY], where=f"{index_path} ({METADATA_KEY} in the header)")

    found: dict[str, list[Block]] = {name: [] for name in shapes}
    for name in files:
        file = path / name
        if not file.is_file():
            raise DamagedCheckpoint(f"{file}: missing (a shard of the sharded checkpoint {path})")
        try:
            with safe_open(str(file), framework="pt") as f:
                slices = json.loads((f.metadata() or {})["slices"])
                stored = {key: (list(f.get_slice(key).get_shape()), str(f.get_slice(key).get_dtype()))
                          for key in f.keys()}
        except Exception as exc:  # safetensors' own error types for truncated or garbage files; RecursionError
            raise DamagedCheckpoint(f"{file}: not a readable shard ({type(exc).__name__}: {exc})") from None
        try:
            entries = [(str(key), current_name(str(of)), [int(o) for o in offsets]) for key, (of, offsets) in slices.items()]
        except (AttributeError, TypeError, ValueError) as exc:
            raise DamagedCheckpoint(f"{file}: its slices header is not a map of blocks ({exc})") from None
        for key, of, offsets in entries:
            shape, dtype = stored.get(key, (None, None))
            fits = (shape is not None and of in shapes and len(offsets) == len(shapes[of]) == len(shape)
                    and all(0 <= o and o + s <= n for o, s, n in zip(offsets, shape, shapes[of])))
            if not fits:
                raise DamagedCheckpoint(f"{file}: its block {key!r} does not fit the tensors of {INDEX}")
            if math.prod(shape) == 0:
                raise DamagedCheckpoint(f"{file}: its block {key!r} holds no values; a block holds at least one")
            if dtype != STORED_DTYPES[dtypes[of]]:
                raise DamagedCheckpoint(f"{file}: its block {key!r} is stored as {dtype}; {INDEX} says {of} is "
                                        f"{dtypes[of]}, expected {STORED_DTYPES[dtypes[of]]}")
            found[of].append(Block(file=file, key=key, offsets=offsets, shape=shape))
    for name, shape in shapes.items():
        # first the count, which bounds the size the index declares by the values stored (before the grid below)
        covered = sum(math.prod(b.shape) for b in found[name])
        if covered != math.prod(shape):
            raise DamagedCheckpoint(f"{path}: the shards hold {covered} of the {math.prod(shape)} values of {name}")
        problem = tiling_problem(shape, found[name])
        if problem:
            raise DamagedCheckpoint(f"{path}: the blocks of {name} {problem}; expected every value in exactly one "
                                    "block")
    return ShardedIndex(path=path, world_size=world_size, files=[path / f for f in files], shapes=shapes,
                        dtypes=dtypes, blocks=found,
                        optimizer=optimizer, header=header)


def tiling_problem(shape: list[int], stored: list[Block]) -> str | None:
    """Why ``stored`` (blocks inside a tensor of ``shape``, as many values in all as it has) does not tile it, or None.

    The blocks' edges cut every dimension into intervals, the tensor into a grid of cells
    (each at least one value, so never more cells than values); each block marks its cells
    and must find them unmarked. Disjoint blocks inside the tensor holding as many values as
    it has cover it whole.
    """
    edges = [sorted({0, n, *(b.offsets[d] for b in stored), *(b.offsets[d] + b.shape[d] for b in stored)})
             for d, n in enumerate(shape)]
    owner = torch.full([len(e) - 1 for e in edges], -1, dtype=torch.int64)  # per cell, the block that holds it
    ordered = sorted(stored, key=lambda b: (b.offsets, str(b.file), b.key))
    for number, block in enumerate(ordered):
        cells = owner[tuple(slice(bisect_left(e, o), bisect_left(e, o + n))
                            for e, o, n in zip(edges, block.offsets, block.shape))]
        taken = cells[cells >= 0]
        if taken.numel():
            other = ordered[int(taken[0])]
            return (f"overlap: {block.key!r} in {block.file.name} and {other.key!r} in {other.file.name} hold "
                    "some of the same values")
        cells.fill_(number)
    return None


class ShardReader:
    """Fills tensors from the stored blocks, each shard file opened once."""

    def __init__(self, index: ShardedIndex) -> None:
        self.index = index
        self._open: dict[Path, Any] = {}

    def __enter__(self) -> "ShardReader":
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._open.values():
            handle.__exit__(None, None, None)
        self._open.clear()

    def _file(self, path: Path) -> Any:
        if path not in self._open:
            handle = safe_open(str(path), framework="pt")
            self._open[path] = handle.__enter__()
        return self._open[path]

    def fill(self, name: str, out: Tensor, indices: list[Tensor]) -> None:
        """Copy into ``out`` (a local share) the stored values at ``indices`` (per dimension, global positions)."""
        copied = 0
        for block in self.index.blocks[name]:
            local_positions, block_positions = [], []
            for index, offset, size in zip(indices, block.offsets, block.shape):
                inside = ((index >= offset) & (index < offset + size)).nonzero().reshape(-1)
                local_positions.append(inside)
                block_positions.append(index[inside] - offset)
            if any(len(p) == 0 for p in local_positions):
                continue
            try:
                stored = self._file(block.file).get_slice(block.key)
                bounds = tuple(slice(int(p.min()), int(p.max()) + 1) for p in block_positions)
                part = stored[bounds] if bounds else self._file(block.file).get_tensor(block.key)
            except Exception as exc:  # a file truncated since its header was read
                raise DamagedCheckpoint(f"{block.file}: cannot read {block.key!r} ({type(exc).__name__}: {exc})") from None
            for dim, (positions, bound) in enumerate(zip(block_positions, bounds)):
                part = part.index_select(dim, positions - bound.start)
            if out.dim() == 0:
                out.copy_(part)
            else:
                where = tuple(p.view(*([1] * d), -1, *([1] * (out.dim() - d - 1))) for d, p in enumerate(local_positions))
                out[where] = part.to(out.dtype)
            copied += part.numel()
        if copied != out.numel():
            raise DamagedCheckpoint(f"{self.index.path}: the shards hold {copied} of the {out.numel()} values of "
                                    f"{name} this process needs")

    def like(self, name: str, template: Tensor, row_order: Tensor | None = None) -> Tensor:
        """A tensor laid out as ``template`` (a DTensor keeps its mesh and placements) holding the stored ``name``."""
        # late: only distributed runs have DTensors; consolidation never asks
        from torch.distributed.tensor import DTensor

        indices, local = global_indices(template, row_order)
        out = torch.zeros_like(local, device="cpu")  # zeros, not whatever memory held, if a value were missed
        self.fill(name, out, indices)
        out = out.to(local.device)
        if isinstance(template, DTensor):
            return DTensor.from_local(out, template.device_mesh, template.placements, run_check=False,
                                      shape=template.shape, stride=template.stride())
        return out

    def whole(self, name: str) -> Tensor:
        """The stored tensor ``name`` in full, on the CPU."""
        shape = self.index.shapes[name]
        out = torch.zeros(shape, dtype=getattr(torch, self.index.dtypes[name]))
        self.fill(name, out, [torch.arange(n) for n in shape])
        return out


# -- applying and consolidating ------------------------------------------------------------------


def check_fits(index: ShardedIndex, model: nn.Module) -> None:
    """Refuse a checkpoint of another model: the stored names and global shapes must be the model's."""
    # late: torch.distributed's state-dict helpers and styles load for a run's resume only, never to consolidate
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from specformer.model.tensor_parallel import fused_row_orders

    orders = fused_row_orders(model)
    expected = {name: tuple(module_shape(t, orders.get(name))) for name, t in get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=False)).items()}

    refuse_misfit(expected, {name: tuple(index.shapes[MODEL + name]) for name in index.model_names()},
                  where=str(index.path))


def load_shards(index: ShardedIndex, *, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Put the stored model and optimizer state into ``model`` and ``optimizer``, laid out as they are split now."""
    # late: torch.distributed's state-dict helpers and styles load for a run's resume only, never to consolidate
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)

    from specformer.model.tensor_parallel import fused_row_orders

    options = StateDictOptions(full_state_dict=False)
    templates = get_model_state_dict(model, options=options)
    orders = fused_row_orders(model)
    with ShardReader(index) as reader:
        weights = {fqn: reader.like(MODEL + fqn, t, orders.get(fqn)) for fqn, t in templates.items()}
        set_model_state_dict(model, weights, options=options)
        state: dict[str, dict[str, Any]] = {}
        prefix = len(OPTIMIZER)
        for name, shape in index.shapes.items():
            if not name.startswith(OPTIMIZER):
                continue
            fqn, _, key = name[prefix:].rpartition("/")
            template = templates.get(fqn)
            if template is not None and module_shape(template, orders.get(fqn)) == shape:  # a moment: split alike
                value = reader.like(name, template, orders.get(fqn))
            else:  # a step count: the same on every process (the optimizer moves it where it keeps it)
                value = reader.whole(name)
            state.setdefault(fqn, {})[key] = value
    for slot, value in index.optimizer["scalars"].items():
        fqn, _, key = slot.rpartition("/")
        state.setdefault(fqn, {})[key] = value
    groups = [dict(g) for g in index.optimizer["param_groups"]]
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups}, options=options)


def read_consolidable(path: Path) -> ShardedIndex:
    """The index of the sharded checkpoint at ``path``, its model's tensors checked against the spec in its header
    as :func:`specformer.load` checks a file's (no tensor the model does not have, each shaped as the model's)."""
    index = read_index(path)
    model = {fqn: TensorInfo(dtype=STORED_DTYPES[index.dtypes[MODEL + fqn]], shape=tuple(index.shapes[MODEL + fqn]))
             for fqn in index.model_names()}
    checked = check_checkpoint(index.path / INDEX, metadata=index.header, tensors=model)
    # The spec as specformer.save writes it now (one stored before a rename is written with the names of now).
    index.header["spec"] = checked.spec.to_json()
    return index


def consolidate(path: Path, out: Path, *, index: ShardedIndex | None = None) -> Path:
    """Write the sharded checkpoint at ``path`` as one ``model.safetensors``-style file at ``out`` (one process).

    ``index``: its :func:`read_consolidable`, when the caller has it already.
    """
    index = index if index is not None else read_consolidable(path)
    with ShardReader(index) as reader:
        tensors = {fqn: reader.whole(MODEL + fqn) for fqn in index.model_names()}
    write_safetensors_atomic(tensors, Path(out), index.header)
    return Path(out)
