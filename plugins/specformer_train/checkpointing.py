"""Training checkpoints: everything needed to continue a run exactly, without pickle.

A checkpoint is a directory ``<out_dir>/checkpoints/step-NNNNNNN/`` holding

- ``model.safetensors``: the weights, with the spec and the tokenizer in the header
  (what ``specformer.load`` and ``specformer generate`` read);
- ``optimizer.safetensors``: the optimizer's state tensors (AdamW's moments and step counts,
  Muon's and SGD's momentum buffers, Lion's momentum) keyed by parameter name, the parameter
  groups and the optimizer's class as JSON in the header;
- ``rng-rank<R>.safetensors``: each process' torch (CPU and CUDA) generator states, with
  Python's and NumPy's as JSON in the header;
- ``trainer.json``: the step, the data position (sequences consumed), counters and the
  data source (see :mod:`specformer_train.datasource`);
- ``tokenizer.json``: the tokenizer, reusable as ``train.tokenizer``.

A sharded checkpoint (``train.checkpoint_format``) holds ``shard-rank<R>.safetensors`` files and
``sharded.json`` in place of the two weight files, written by every process without gathering
(:mod:`specformer_train.sharded_checkpoint`); the rest is the same, and so is the protocol below.

Saving never removes a good copy before its replacement is complete:

1. the directory is written under a temporary name unique to the run
   (``.step-N.tmp-<pid>-<random>``), every file flushed to disk;
2. when ``step-N`` already exists (the same step saved again after resuming from an
   older one), it is renamed aside to ``.step-N.old-<pid>-<random>``;
3. the new directory is renamed to ``step-N``; then ``latest`` is replaced (write,
   flush, rename) to name it; only then is the old copy deleted, and the checkpoints
   beyond ``keep_last`` pruned.

A kill at any moment leaves either ``step-N`` or its aside copy intact;
:func:`recover_interrupted_saves` (run at the start of every run, under the run lock)
puts an orphaned aside copy back and deletes unfinished temporaries. Reading is split
from applying: :func:`read_checkpoint` reads and checks every file, raising
:class:`DamagedCheckpoint` naming the bad one, so ``--resume`` can fall back to an older
checkpoint before anything is changed (:mod:`specformer_train.resume`).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from torch import nn

import specformer
from specformer.files.atomic import fsync_dir, unique_suffix, write_text_atomic
from specformer.checkpoint.locate import (CHECKPOINTS, LATEST, checkpoint_root, latest_checkpoint,
                                         latest_name, step_dirs, step_name)
from specformer.checkpoint.save_load import read_metadata, read_tensors, write_safetensors_atomic
from specformer.errors import CheckpointError
from specformer.model.parallel_plan import ROW_ORDER
from specformer.registry.discovery import get_plugin_manager
from specformer.tokenizers.tokenizer import METADATA_KEY, Tokenizer
from specformer_text import OutputError

from specformer_train.parallel.distributed import barrier
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.checkpoint_files import DamagedCheckpoint, parse_json, read_json, refuse_misfit
from specformer_train.optimizer_state import current_groups, current_slots, group_problems, state_problems
from specformer_train.sharded_checkpoint import (ShardedIndex, check_fits, is_sharded, load_shards, model_header,
                                                 read_index, write_shards)

TRAINER_FORMAT = "specformer-train-state/1"
_LEFTOVER = re.compile(r"^\.(step-\d+)\.(tmp|old)(-.*)?$")  # an unfinished save's temporaries


@dataclass
class TrainerState:
    """The counters of a run; ``sequences`` is the data position (see :mod:`specformer_train.data`)."""

    step: int = 0
    sequences: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    world_size: int = 1
    threads: int | None = None  # CPU threads of the run (see specformer_train.threads)
    last_val_loss: float | None = None
    data: dict[str, Any] | None = None  # the data source record (specformer_train.datasource)
    extra: dict[str, Any] = field(default_factory=dict)


# -- where checkpoints are: specformer.checkpoint.locate (every command reads the same layout) --------


def recover_interrupted_saves(out_dir: Path) -> list[str]:
    """Finish what a killed save left behind; return a note for each repair.

    Only called by the process that holds the run lock, so no save is in progress.
    """
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    notes = []
    for child in sorted(root.iterdir()):
        match = _LEFTOVER.match(child.name)
        if not match or not child.is_dir():
            continue
        name, kind = match.group(1), match.group(2)
        final = root / name
        if kind == "old" and not final.exists():
            os.replace(child, final)  # the replacement never arrived: the old copy is the checkpoint
            notes.append(f"restored {final}, which an interrupted save had moved aside")
        else:
            shutil.rmtree(child, ignore_errors=True)  # unfinished, or superseded by a complete step-N
    if notes:
        fsync_dir(root)
    return notes


def earlier_run_files(out_dir: Path) -> list[str]:
    """What in ``out_dir`` belongs to an earlier run and a fresh start would replace."""
    found = [path.name for _, path in step_dirs(out_dir)]
    found += [name for name in ("model.safetensors",) if (Path(out_dir) / name).is_file()]
    return found


def clear_earlier_run(out_dir: Path) -> int:
    """Remove an earlier run's checkpoints and final files from ``out_dir`` (``--overwrite``); return how many checkpoints."""
    root = checkpoint_root(out_dir)
    removed = 0
    for _, path in step_dirs(out_dir):
        shutil.rmtree(path)
        removed += 1
    if root.is_dir():
        for child in root.iterdir():
            if child.name == LATEST or _LEFTOVER.match(child.name):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    for name in ("model.safetensors", "tokenizer.json", "loss.png"):
        (Path(out_dir) / name).unlink(missing_ok=True)
    shutil.rmtree(Path(out_dir) / "tensorboard", ignore_errors=True)
    return removed


# -- saving ----------------------------------------------------------------------------


def save_checkpoint(*, out_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainerState,
                    tokenizer: Tokenizer, ctx: ParallelLayout, keep_last: int, tag: str | None = None,
                    sharded: bool = False) -> Path:
    """Write a complete checkpoint of step ``state.step`` (every process calls this); return its path.

    ``sharded``: every process writes its share of the weights and the optimizer state
    (:mod:`specformer_train.sharded_checkpoint`) instead of the first writing them gathered.

    ``tag`` makes the temporary names unique to this run; it must be the same on every
    process (:func:`specformer_train.parallel.distributed.shared_tag`); one process may leave it out. A failure to write raises
    :class:`OutputError` and leaves the earlier checkpoints and ``latest`` as they were.
    """
    root = checkpoint_root(out_dir)
    name = step_name(state.step)
    tag = tag or unique_suffix()
    tmp, final, aside = root / f".{name}.tmp-{tag}", root / name, root / f".{name}.old-{tag}"
    try:
        if ctx.is_main:
            tmp.mkdir(parents=True)
        barrier(ctx)

        if sharded:
            header = model_header(model, {METADATA_KEY: tokenizer.to_json(), "train_step": str(state.step)})
            write_shards(tmp, model=model, optimizer=optimizer, rank=ctx.rank, world_size=ctx.world_size,
                         header=header)
        else:
            _save_full(tmp, final, model=model, optimizer=optimizer, state=state, tokenizer=tokenizer, ctx=ctx)
        _save_rng(tmp / f"rng-rank{ctx.rank}.safetensors")
        barrier(ctx)

        if ctx.is_main:
            write_text_atomic(tmp / "trainer.json", json.dumps({"format": TRAINER_FORMAT, **asdict(state)}, indent=1))
            write_text_atomic(tmp / "tokenizer.json", tokenizer_file_text(tokenizer))
            fsync_dir(tmp)
            _move_into_place(tmp, final, aside)
            write_text_atomic(root / LATEST, name)
            fsync_dir(root)
            shutil.rmtree(aside, ignore_errors=True)  # only now: the new copy is in place and named
            prune(out_dir, keep_last=keep_last, keep=final)
    except OSError as exc:
        if ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            if aside.exists() and not final.exists():
                os.replace(aside, final)
        previous = latest_checkpoint(out_dir)
        kept = f"the latest checkpoint is still {previous}" if previous else "no earlier checkpoint was changed"
        raise OutputError(f"could not save checkpoint {final}: {exc.strerror or exc}; {kept}") from None
    barrier(ctx)
    return final


def _save_full(tmp: Path, final: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainerState,
               tokenizer: Tokenizer, ctx: ParallelLayout) -> None:
    """``model.safetensors`` and ``optimizer.safetensors`` into ``tmp``, gathered to the first process."""
    model_state, optim_state = full_state_dicts(model, optimizer)  # collective under FSDP
    if not ctx.is_main:
        return
    header = {METADATA_KEY: tokenizer.to_json(), "train_step": str(state.step)}
    # A plugin may store a part of the weights (an adapter's) with header entries of its own.
    part = get_plugin_manager().hook.specformer_train_saved_weights(
        model=model, weights=model_state, path=str(final / "model.safetensors"))
    if part is not None:
        model_state, entries = part
        header = {**entries, **header}
    specformer.save(_WeightsOf(model, model_state), tmp / "model.safetensors", metadata=header)
    _save_optimizer(optim_state, tmp / "optimizer.safetensors", optimizer_class=type(optimizer).__name__)


def _move_into_place(tmp: Path, final: Path, aside: Path) -> None:
    """Rename ``tmp`` to ``final``; an existing ``final`` is moved aside first, never deleted here."""
    if final.exists():  # the same step saved again after a resume from an older one
        os.replace(final, aside)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def tokenizer_file_text(tokenizer: Tokenizer) -> str:
    """A Hugging Face tokenizer.json for BPE; specformer's own JSON (``{"kind": "byte"}``) for bytes."""
    inner = getattr(tokenizer, "inner", None)
    return inner.to_str() if inner is not None else tokenizer.to_json()


def prune(out_dir: Path, *, keep_last: int, keep: Path) -> None:
    dirs = step_dirs(out_dir)
    for _, path in dirs[: max(0, len(dirs) - keep_last)]:
        if path != keep:
            shutil.rmtree(path, ignore_errors=True)


def full_state_dicts(model: nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Unsharded model and optimizer state keyed by parameter name, on the CPU (rank 0's under FSDP)."""
    # late: torch.distributed.checkpoint is only needed by sharded (FSDP) runs
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    from specformer.model.expert_parallel import gather_experts
    from specformer_train.parallel.tensor import gathered_in_module_order

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    model_state = get_model_state_dict(model, options=options)
    optim_state = get_optimizer_state_dict(model, optimizer, options=options)
    model_state, optim_state = gather_experts(model, optimizer, model_state, optim_state)  # split by expert parallelism
    return gathered_in_module_order(model, model_state, optim_state)  # fused projections split by tensor parallelism


class _WeightsOf:
    """What :func:`specformer.save` needs (a spec and a state dict) for weights gathered from shards."""

    def __init__(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        self.spec = model.spec
        self._state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


def _save_optimizer(state: dict[str, Any], path: Path, *, optimizer_class: str) -> None:
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {}
    for param_name, entries in state["state"].items():
        for key, value in entries.items():
            slot = f"{param_name}/{key}"
            if isinstance(value, torch.Tensor):
                tensors[slot] = value.detach().cpu().contiguous().clone()
            else:
                scalars[slot] = value
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in state["param_groups"]]
    # Through the atomic writer for its file mode too: safetensors alone writes 0600 files, not the umask's.
    write_safetensors_atomic(tensors, path, {"param_groups": json.dumps(groups), "scalars": json.dumps(scalars),
                                             "optimizer": optimizer_class})


def _save_rng(path: Path) -> None:
    tensors = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        tensors["torch_cuda"] = torch.cuda.get_rng_state()
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    metadata = {
        "python": json.dumps([version, list(internal), gauss_next]),
        "numpy": json.dumps([name, keys.tolist(), int(pos), int(has_gauss), float(gauss)]),
    }
    write_safetensors_atomic(tensors, path, metadata)


# -- loading ---------------------------------------------------------------------------


@dataclass
class CheckpointContents:
    """A checkpoint read into memory and checked, not yet applied to a model."""

    path: Path
    state: TrainerState
    weights: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    tokenizer_json: str | None
    rng: dict[str, Any] | None  # this process' generator states; None when not restorable
    sharded: ShardedIndex | None = None  # a sharded checkpoint's index: weights and optimizer are read when applied


def load_checkpoint(path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, tokenizer: Tokenizer,
                    ctx: ParallelLayout) -> TrainerState:
    """Restore model, optimizer and this process' RNG states from ``path``; return the trainer state."""
    contents = read_checkpoint(path, rank=ctx.rank, world_size=ctx.world_size)
    return apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=tokenizer)


def read_checkpoint(path: Path, *, rank: int = 0, world_size: int = 1) -> CheckpointContents:
    """Read and check every file of the checkpoint at ``path``; :class:`DamagedCheckpoint` names a bad one."""
    path = Path(path)
    if not path.is_dir():
        raise DamagedCheckpoint(f"{path}: no such checkpoint directory")
    if is_sharded(path):
        return _read_sharded(path, rank=rank, world_size=world_size)
    for needed in ("model.safetensors", "optimizer.safetensors", "trainer.json"):
        if not (path / needed).is_file():
            raise DamagedCheckpoint(f"{path}: not a complete training checkpoint (no {needed})")
    state = _read_trainer_state(path / "trainer.json")
    try:
        metadata = read_metadata(path / "model.safetensors")
        weights = read_tensors(path / "model.safetensors")
    except CheckpointError as exc:
        raise DamagedCheckpoint(str(exc)) from None
    optim = _load_optimizer(path / "optimizer.safetensors", weights=weights)
    return CheckpointContents(path=path, state=state, weights=weights, optimizer=optim,
                              tokenizer_json=_tokenizer_json(metadata, where=path / "model.safetensors"),
                              rng=_rng_of(path, state, rank, world_size))


def _tokenizer_json(header: dict[str, str], *, where: Path) -> str | None:
    """The tokenizer stored in a header, checked to parse now (it is compared when the checkpoint is applied)."""
    text = header.get(METADATA_KEY)
    if text is not None:
        parse_json(text, where=f"{where} ({METADATA_KEY} in the header)")
    return text


def _read_sharded(path: Path, *, rank: int, world_size: int) -> CheckpointContents:
    """A sharded checkpoint's index and every shard's header checked; the tensors are read when applied."""
    if not (path / "trainer.json").is_file():
        raise DamagedCheckpoint(f"{path}: not a complete training checkpoint (no trainer.json)")
    state = _read_trainer_state(path / "trainer.json")
    index = read_index(path)
    optimizer = {"optimizer": index.optimizer.get("class", "AdamW"), "param_groups": index.optimizer["param_groups"]}
    return CheckpointContents(path=path, state=state, weights={}, optimizer=optimizer,
                              tokenizer_json=index.header.get(METADATA_KEY),  # parsed by read_index
                              rng=_rng_of(path, state, rank, world_size), sharded=index)


def _rng_of(path: Path, state: TrainerState, rank: int, world_size: int) -> dict[str, Any] | None:
    rng_path = path / f"rng-rank{rank}.safetensors"
    # RNG states only carry over to the same number of processes (each has its own stream).
    return _read_rng(rng_path) if rng_path.is_file() and state.world_size == world_size else None


def apply_checkpoint(contents: CheckpointContents, *, model: nn.Module, optimizer: torch.optim.Optimizer,
                     tokenizer: Tokenizer) -> TrainerState:
    """Put a read checkpoint into ``model``, ``optimizer`` and the RNGs; a mismatch with this run is refused."""
    # late: torch.distributed.checkpoint is only needed by sharded (FSDP) runs
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    from specformer.model.expert_parallel import local_rows
    from specformer_train.parallel.tensor import in_rank_order

    path = contents.path
    check_tokenizer(contents, tokenizer)
    _check_optimizer(contents, optimizer)
    if contents.sharded is not None:
        check_fits(contents.sharded, model)
        load_shards(contents.sharded, model=model, optimizer=optimizer)
        if contents.rng is not None:
            _set_rng(contents.rng)
        return contents.state
    # A checkpoint storing a part of the weights (an adapter's): its plugin completes them from the model.
    weights = get_plugin_manager().hook.specformer_train_resumed_weights(model=model, weights=contents.weights)
    weights = contents.weights if weights is None else weights
    weights, saved_optimizer = local_rows(model, weights, contents.optimizer)  # experts split by expert parallelism
    _check_shapes(model, weights, where=str(path / "model.safetensors"))
    options = StateDictOptions(full_state_dict=True)
    state = {k: v for k, v in saved_optimizer.items() if k != "optimizer"}
    weights, state = in_rank_order(model, weights, state)  # fused projections split by tensor parallelism
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, state, options=options)
    if contents.rng is not None:
        _set_rng(contents.rng)
    return contents.state


def _check_optimizer(contents: CheckpointContents, optimizer: torch.optim.Optimizer) -> None:
    """Refuse another optimizer class or another number of parameter groups than the checkpoint's."""
    path = contents.path
    saved_class = contents.optimizer.get("optimizer", "AdamW")  # checkpoints from before the kind existed: AdamW
    if saved_class != type(optimizer).__name__:
        raise CheckpointError(f"{path}: the run was trained with the optimizer {saved_class}, this spec's "
                              f"train.optimizer builds {type(optimizer).__name__}; resume with the optimizer the "
                              "run was started with")
    saved_groups = len(contents.optimizer["param_groups"])
    if saved_groups != len(optimizer.param_groups):
        raise CheckpointError(f"{path}: the optimizer state has {saved_groups} parameter groups, this spec's "
                              f"train.optimizer makes {len(optimizer.param_groups)}; resume with the groups rules "
                              "the run was started with")
    kinds = group_problems(contents.optimizer["param_groups"], optimizer.param_groups)
    if kinds:
        raise CheckpointError(f"{path}: the stored optimizer settings are not of the kind "
                              f"{type(optimizer).__name__} takes ({'; '.join(kinds)})")


def check_tokenizer(contents: CheckpointContents, tokenizer: Tokenizer) -> None:
    """Refuse to continue a run with another tokenizer than it was trained with."""
    saved = contents.tokenizer_json
    if saved is not None and json.loads(saved) != json.loads(tokenizer.to_json()):
        raise CheckpointError(f"{contents.path}: the checkpoint was trained with a different tokenizer than "
                              "train.tokenizer gives now; resume with the same tokenizer and data")


def _read_trainer_state(path: Path) -> TrainerState:
    data = read_json(path)
    if not isinstance(data, dict) or data.pop("format", None) != TRAINER_FORMAT:
        raise DamagedCheckpoint(f"{path}: unknown format; expected {TRAINER_FORMAT!r}")
    known = {f.name for f in fields(TrainerState)}
    state = TrainerState(**{k: v for k, v in data.items() if k in known})
    counters = (state.step, state.sequences, state.tokens, state.world_size)
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counters) or state.world_size < 1:
        raise DamagedCheckpoint(f"{path}: step, sequences, tokens and world_size must be non-negative integers, "
                                f"got {counters}")
    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    typed = (number(state.elapsed_s) and (state.last_val_loss is None or number(state.last_val_loss))
             and (state.threads is None or (isinstance(state.threads, int) and number(state.threads)))
             and (state.data is None or isinstance(state.data, dict)) and isinstance(state.extra, dict))
    if not typed:
        raise DamagedCheckpoint(f"{path}: elapsed_s, last_val_loss, threads, data or extra has the wrong type")
    return state


def _check_shapes(model: nn.Module, weights: dict[str, torch.Tensor], *, where: str) -> None:
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name, order in _fused_orders(model).items():  # a tensor-parallel copy of key/value heads: the module's rows
        expected[name] = (int(order.max()) + 1, *expected[name][1:])
    refuse_misfit(expected, {name: tuple(t.shape) for name, t in weights.items()}, where=where)


def _fused_orders(model: nn.Module) -> dict[str, torch.Tensor]:
    if not any(hasattr(m, ROW_ORDER) for m in model.modules()):
        return {}
    # late: only a tensor-parallel model has fused orders, and only its run needs torch.distributed's styles
    from specformer.model.tensor_parallel import fused_row_orders

    return fused_row_orders(model)


def _load_optimizer(path: Path, *, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The optimizer's state as saved; its per-parameter tensors must match the weights saved beside it."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = current_slots({name: f.get_tensor(name) for name in f.keys()})  # named as the weights are
        groups = current_groups(json.loads(metadata["param_groups"]))
        scalars = current_slots(json.loads(metadata.get("scalars", "{}")))
        optimizer_class = metadata.get("optimizer", "AdamW")
    except Exception as exc:  # safetensors raises its own error types for truncated or garbage files
        raise DamagedCheckpoint(f"{path}: not a readable optimizer state ({type(exc).__name__}: {exc})") from None
    problems = state_problems({slot: (list(t.shape), str(t.dtype).removeprefix("torch.")) for slot, t in tensors.items()},
                              scalars, {name: list(t.shape) for name, t in weights.items()}, groups)
    if problems:
        raise DamagedCheckpoint(f"{path}: " + "; ".join(problems))
    state: dict[str, dict[str, Any]] = {}
    for slot, value in [*tensors.items(), *scalars.items()]:
        param_name, _, key = slot.rpartition("/")
        state.setdefault(param_name, {})[key] = value
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups, "optimizer": optimizer_class}


def _read_rng(path: Path) -> dict[str, Any]:
    """The generator states of one process, checked by setting them (then putting the current ones back)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            rng = {"torch_cpu": f.get_tensor("torch_cpu"),
                   "torch_cuda": f.get_tensor("torch_cuda") if "torch_cuda" in f.keys() else None}
        version, internal, gauss_next = json.loads(metadata["python"])
        rng["python"] = (version, tuple(internal), gauss_next)
        name, keys, pos, has_gauss, gauss = json.loads(metadata["numpy"])
        rng["numpy"] = (name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss)
        current = _get_rng()
        try:
            _set_rng(rng)
        finally:
            _set_rng(current)
    except Exception as exc:  # whatever a damaged file makes the readers or setters raise
        raise DamagedCheckpoint(f"{path}: not a readable random-number-generator state "
                                f"({type(exc).__name__}: {exc})") from None
    return rng


def _get_rng() -> dict[str, Any]:
    return {"torch_cpu": torch.get_rng_state(), "torch_cuda": None, "python": random.getstate(),
            "numpy": np.random.get_state()}


def _set_rng(rng: dict[str, Any]) -> None:
    torch.set_rng_state(rng["torch_cpu"])
    if rng.get("torch_cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["torch_cuda"])
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
