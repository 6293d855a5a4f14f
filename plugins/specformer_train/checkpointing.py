"""Training checkpoints: everything needed to continue a run exactly, without pickle.

A checkpoint is a directory ``<out_dir>/checkpoints/step-NNNNNNN/`` holding

- ``model.safetensors``: the weights, with the spec and the tokenizer in the header
  (what ``specformer.load`` and ``specformer generate`` read);
- ``optimizer.safetensors``: AdamW's moments and step counts keyed by parameter name,
  the parameter groups as JSON in the header;
- ``rng-rank<R>.safetensors``: each process' torch (CPU and CUDA) generator states, with
  Python's and NumPy's as JSON in the header;
- ``trainer.json``: the step, the data position (sequences consumed) and counters;
- ``tokenizer.json``: the tokenizer, reusable as ``train.tokenizer``.

The directory is written under a temporary name and renamed when complete; then the
``latest`` file is replaced (write, fsync, rename) to name it. A kill at any moment
leaves ``latest`` naming a complete checkpoint. Only the last ``keep_last`` are kept.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

import specformer
from specformer.checkpoint import read_metadata, read_tensors
from specformer.errors import CheckpointError
from specformer.tokenizer import METADATA_KEY, Tokenizer

from specformer_train.cache import write_text_atomic
from specformer_train.distributed import DistContext, barrier

CHECKPOINTS = "checkpoints"
LATEST = "latest"
TRAINER_FORMAT = "specformer-train-state/1"
_STEP_DIR = re.compile(r"^step-(\d+)$")


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
    extra: dict[str, Any] = field(default_factory=dict)


# -- where checkpoints are -------------------------------------------------------------


def checkpoint_root(out_dir: Path) -> Path:
    return Path(out_dir) / CHECKPOINTS


def step_dirs(out_dir: Path) -> list[tuple[int, Path]]:
    """Complete checkpoint directories, oldest first."""
    root = checkpoint_root(out_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_DIR.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(out_dir: Path) -> Path | None:
    """The directory ``latest`` names, or None when the run has no checkpoint yet."""
    pointer = checkpoint_root(out_dir) / LATEST
    if not pointer.is_file():
        return None
    target = checkpoint_root(out_dir) / pointer.read_text(encoding="utf-8").strip()
    return target if target.is_dir() else None


def clear_checkpoints(out_dir: Path) -> int:
    """Remove the checkpoints of an earlier run in ``out_dir`` (a fresh start); return how many."""
    root = checkpoint_root(out_dir)
    removed = 0
    for _, path in step_dirs(out_dir):
        shutil.rmtree(path)
        removed += 1
    if root.is_dir():
        for child in root.iterdir():
            if child.name == LATEST or child.name.startswith(".step-"):
                shutil.rmtree(child) if child.is_dir() else child.unlink()
    return removed


# -- saving ----------------------------------------------------------------------------


def save_checkpoint(*, out_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, state: TrainerState,
                    tokenizer: Tokenizer, ctx: DistContext, keep_last: int) -> Path:
    """Write a complete checkpoint of step ``state.step`` (every process calls this); return its path."""
    root = checkpoint_root(out_dir)
    name = f"step-{state.step:07d}"
    tmp = root / f".{name}.tmp"
    if ctx.is_main:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
    barrier(ctx)

    model_state, optim_state = full_state_dicts(model, optimizer)  # collective under FSDP
    if ctx.is_main:
        specformer.save(_WeightsOf(model, model_state), tmp / "model.safetensors",
                        metadata={METADATA_KEY: tokenizer.to_json(), "train_step": str(state.step)})
        _save_optimizer(optim_state, tmp / "optimizer.safetensors")
    _save_rng(tmp / f"rng-rank{ctx.rank}.safetensors")
    barrier(ctx)

    final = root / name
    if ctx.is_main:
        write_text_atomic(tmp / "trainer.json", json.dumps({"format": TRAINER_FORMAT, **asdict(state)}, indent=1))
        write_text_atomic(tmp / "tokenizer.json", tokenizer_file_text(tokenizer))
        if final.exists():  # the same step saved again after a resume: replace it whole
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        write_text_atomic(root / LATEST, name)
        _fsync_dir(root)
        prune(out_dir, keep_last=keep_last, keep=final)
    barrier(ctx)
    return final


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
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict)

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


class _WeightsOf:
    """What :func:`specformer.save` needs (a spec and a state dict) for weights gathered from shards."""

    def __init__(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        self.spec = model.spec
        self._state = state

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self._state


def _save_optimizer(state: dict[str, Any], path: Path) -> None:
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
    save_file(tensors, str(path), metadata={"param_groups": json.dumps(groups), "scalars": json.dumps(scalars)})
    with open(path, "rb") as f:
        os.fsync(f.fileno())


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
    save_file(tensors, str(path), metadata=metadata)
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # not possible on every platform; the renames are still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- loading ---------------------------------------------------------------------------


def load_checkpoint(path: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer, tokenizer: Tokenizer,
                    ctx: DistContext) -> TrainerState:
    """Restore model, optimizer and this process' RNG states from ``path``; return the trainer state."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    path = Path(path)
    for needed in ("model.safetensors", "optimizer.safetensors", "trainer.json"):
        if not (path / needed).is_file():
            raise CheckpointError(f"{path}: not a training checkpoint (no {needed})")
    metadata = read_metadata(path / "model.safetensors")
    saved_tokenizer = metadata.get(METADATA_KEY)
    if saved_tokenizer is not None and json.loads(saved_tokenizer) != json.loads(tokenizer.to_json()):
        raise CheckpointError(f"{path}: the checkpoint was trained with a different tokenizer than "
                              "train.tokenizer gives now; resume with the same tokenizer and data")
    weights = read_tensors(path / "model.safetensors")
    _check_shapes(model, weights, where=str(path / "model.safetensors"))
    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, _load_optimizer(path / "optimizer.safetensors"), options=options)

    data = json.loads((path / "trainer.json").read_text(encoding="utf-8"))
    if data.pop("format", None) != TRAINER_FORMAT:
        raise CheckpointError(f"{path}/trainer.json: unknown format; expected {TRAINER_FORMAT!r}")
    state = TrainerState(**data)
    rng = path / f"rng-rank{ctx.rank}.safetensors"
    if rng.is_file() and state.world_size == ctx.world_size:
        _load_rng(rng)
    return state


def _check_shapes(model: nn.Module, weights: dict[str, torch.Tensor], *, where: str) -> None:
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    got = {name: tuple(t.shape) for name, t in weights.items()}
    if expected != got:
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        shaped = sorted(f"{n} {got[n]} vs {expected[n]}" for n in set(got) & set(expected) if got[n] != expected[n])
        raise CheckpointError(
            f"{where}: does not fit the model of this spec (missing {missing or 'none'}, unexpected "
            f"{extra or 'none'}, mis-shaped {shaped or 'none'}); resume with the spec the run was started with"
        )


def _load_optimizer(path: Path) -> dict[str, Any]:
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    try:
        groups = json.loads(metadata["param_groups"])
        scalars = json.loads(metadata.get("scalars", "{}"))
    except (KeyError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: optimizer state without valid param_groups ({exc})") from None
    state: dict[str, dict[str, Any]] = {}
    for slot, value in [*tensors.items(), *scalars.items()]:
        param_name, _, key = slot.rpartition("/")
        state.setdefault(param_name, {})[key] = value
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    return {"state": state, "param_groups": groups}


def _load_rng(path: Path) -> None:
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
        torch.set_rng_state(f.get_tensor("torch_cpu"))
        if "torch_cuda" in f.keys() and torch.cuda.is_available():
            torch.cuda.set_rng_state(f.get_tensor("torch_cuda"))
    version, internal, gauss_next = json.loads(metadata["python"])
    random.setstate((version, tuple(internal), gauss_next))
    name, keys, pos, has_gauss, gauss = json.loads(metadata["numpy"])
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, gauss))
