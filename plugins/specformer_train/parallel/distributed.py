"""Data-parallel training on ``torch.distributed``, launched by ``torchrun``.

``torchrun --nproc_per_node=N -m specformer.cli train SPEC`` starts N processes with
``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` set; each builds the same model (same seed),
reads its own slice of every global batch, and the gradients are averaged:

- ``ddp``: every process holds the whole model (DistributedDataParallel);
- ``fsdp``: parameters, gradients and optimizer state are sharded across processes
  with FSDP2's ``fully_shard``, applied to each block and then to the whole model;
- ``tp`` (``train.parallel.tp``): every process reads the same rows and holds its share of
  each component that declares a tensor-parallel plan (:mod:`specformer_train.parallel.tensor`);
- ``cp`` (``train.parallel.cp``, beside ddp or fsdp): the processes of a group read the same rows,
  each taking its share of every row's tokens (:mod:`specformer_train.parallel.context`).
- ``train.parallel.ep`` beside ddp or fsdp: the processes still read different rows, and each
  holds its share of every mixture's experts (:mod:`specformer_train.parallel.expert`).

NCCL is the backend on CUDA, gloo on CPU (so the tests run two processes on a laptop).
The layout of the processes is :class:`~specformer_train.parallel.layout.ParallelLayout`;
the model is split and wrapped for it by :func:`~specformer_train.parallel.parallelize.parallelize`.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist
from torch import nn

from specformer.errors import UserError
from specformer_train.parallel.layout import ParallelLayout


def device_for(requested: str, ctx: ParallelLayout) -> torch.device:
    """The device of this process: ``auto`` is CUDA (this process' GPU under torchrun) when available."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise UserError(f"train.device {requested!r} is not a device; accepted: auto, cpu, cuda, cuda:N, mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"train.device {requested!r}: CUDA is not available on this machine; use cpu or auto")
        if device.index is None:
            device = torch.device("cuda", ctx.local_rank if ctx.enabled else torch.cuda.current_device())
        torch.cuda.set_device(device)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError("train.device 'mps' is not available on this machine; use cpu or auto")
    return device


def init_distributed(layout: ParallelLayout, *, device: str = "auto") -> ParallelLayout:
    """Join the process group torchrun set up and build the layout's meshes on this process' device (``device``:
    ``train.device``); the layout as it is when not distributed."""
    if not layout.enabled:
        return layout
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))
    return layout.with_meshes(device_for(device, layout).type)


def shutdown(ctx: ParallelLayout) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def gradient_sync(wrapped: nn.Module, ctx: ParallelLayout, *, sync: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on micro-steps before the last of an accumulation."""
    if ctx.mode == "ddp" and not sync:
        with wrapped.no_sync():
            yield
        return
    if ctx.mode == "fsdp":
        wrapped.set_requires_gradient_sync(sync)
    yield


def optimizer_step_scope(ctx: ParallelLayout) -> contextlib.AbstractContextManager:
    """Where the optimizer steps: under tensor parallelism (or FSDP beside expert parallelism), split (DTensor) and
    plain parameters meet in the same fused updates, which DTensor allows only when plain tensors count as
    replicated."""
    if ctx.tp == 1 and not (ctx.ep > 1 and ctx.mode == "fsdp"):  # FSDP's DTensors beside whole expert stacks too
        return contextlib.nullcontext()
    # late: only tensor-parallel runs need DTensors
    from torch.distributed.tensor.experimental import implicit_replication

    return implicit_replication()


def all_reduce_mean(value: torch.Tensor, ctx: ParallelLayout) -> torch.Tensor:
    """The mean of ``value`` over processes (``value`` itself when not distributed)."""
    if not ctx.enabled:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / ctx.world_size


def any_process(flag: bool, ctx: ParallelLayout, device: torch.device) -> bool:
    """True when ``flag`` is true on any process (so that all stop at the same step)."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def shared_tag(ctx: ParallelLayout, device: torch.device) -> str:
    """``<pid>-<random hex>`` drawn by the first process and shared with all: names of this run's temporaries.

    Drawn from the operating system, not from a seeded generator, so it never shifts a
    seeded run's random numbers.
    """
    values = torch.tensor([os.getpid(), int.from_bytes(os.urandom(4), "little")], dtype=torch.int64)
    if ctx.enabled:
        values = values.to(device)
        dist.broadcast(values, src=0)
    pid, token = (int(v) for v in values.tolist())
    return f"{pid}-{token:08x}"


def barrier(ctx: ParallelLayout) -> None:
    if ctx.enabled:
        dist.barrier()

