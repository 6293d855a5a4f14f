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
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch import nn

from specformer.errors import UserError


@dataclass
class DistContext:
    """Who this process is in the run, and how the model is replicated."""

    mode: str = "none"  # none | ddp | fsdp | tp
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    tp: int = 1  # processes splitting each component (train.parallel.tp); they read the same rows
    ep: int = 1  # processes splitting each mixture's experts (train.parallel.ep); they read different rows
    cp: int = 1  # processes splitting each row's tokens (train.parallel.cp); they read the same rows
    cp_group: Any = None  # their process group, once made (wrap_model)
    layout: str = ""  # how the model is split across processes, in words (tensor, expert or context parallelism)
    tp_mesh: Any = None  # the tensor-parallel group's DeviceMesh, once the model is split
    tp_summed: tuple[str, ...] = ()  # parameters whose gradients are summed over it (parallel_plan.Shared)
    tp_copies: dict[str, Any] = field(default_factory=dict)  # fused parameters holding copied key/value heads
    sequence_parallel: bool = False  # train.parallel.sequence_parallel: the stream cut by sequence between sublayers
    sequence: Any = None  # its switch and moves, once the model is split (sequence_parallel.SequenceSplit)
    experts: Any = None  # the expert-parallel groups and split parameters (expert_parallel.ExpertLayout)

    @property
    def dp_rank(self) -> int:
        """This process' place among those that read different rows: ranks are laid out ``[dp][cp][tp]``."""
        return self.rank // (self.tp * self.cp)

    @property
    def dp_size(self) -> int:
        """How many processes read different rows of each global batch."""
        return self.world_size // (self.tp * self.cp)

    @property
    def cp_rank(self) -> int:
        """This process' place in its context-parallel group (which of each row's chunks it takes)."""
        return (self.rank // self.tp) % self.cp

    def mesh(self) -> dict[str, Any]:
        """How this run lays its processes out, as recorded in every checkpoint's ``trainer.json`` (``extra.mesh``)."""
        return {"processes": self.world_size, "distributed": self.mode, "dp": self.dp_size, "tp": self.tp, "ep": self.ep,
                "cp": self.cp}

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def resolve_mode(requested: str, *, tp: int = 1, ep: int = 1, cp: int = 1) -> str:
    """``auto`` becomes ddp under a multi-process launch (tp when ``tp`` > 1, ddp beside ``ep`` > 1 or ``cp`` > 1), none
    otherwise; a mismatch is a UserError."""
    world = launched_world_size()
    if cp > 1:
        if tp > 1 or ep > 1:
            other = f"train.parallel.tp {tp}" if tp > 1 else f"train.parallel.ep {ep}"
            raise UserError(f"train.parallel.cp {cp} with {other}: context parallelism beside tensor or expert "
                            f"parallelism is not built yet; use one of them")
        _needs_launch_of(f"train.parallel.cp {cp}", multiple=cp, world=world)
        if requested not in ("auto", "ddp", "fsdp"):
            raise UserError(f"train.parallel.cp {cp}: train.distributed must be auto, ddp or fsdp (the gradients are "
                            f"averaged over every process), not {requested}")
        return "ddp" if requested == "auto" else requested
    if ep > 1:
        return _resolve_expert_parallel(requested, tp=tp, ep=ep, world=world)
    if tp > 1:
        if requested not in ("auto", "fsdp"):
            raise UserError(f"train.parallel.tp {tp}: train.distributed must be auto (tensor parallelism alone) or "
                            f"fsdp (FSDP2 across the tensor-parallel groups), not {requested}")
        _needs_launch_of(f"train.parallel.tp {tp}", multiple=tp, world=world)
        if requested == "auto" and world != tp:
            raise UserError(f"{world} processes were launched with train.parallel.tp {tp}: set train.distributed=fsdp "
                            f"to shard the model across the {world // tp} tensor-parallel groups")
        return "tp" if requested == "auto" else "fsdp"
    if requested == "auto":
        return "ddp" if world > 1 else "none"
    if requested == "none" and world > 1:
        raise UserError(f"{world} processes were launched but train.distributed is 'none'; "
                        "use ddp or fsdp (e.g. --set train.distributed=ddp)")
    if requested in ("ddp", "fsdp") and "RANK" not in os.environ:
        raise UserError(f"train.distributed {requested!r} needs a launch by torchrun, e.g. "
                        "torchrun --standalone --nproc_per_node=2 -m specformer.cli train SPEC")
    return requested


def _resolve_expert_parallel(requested: str, *, tp: int, ep: int, world: int) -> str:
    """ddp (for auto) or fsdp beside ``ep`` > 1 (fsdp beside tp too); what does not fit is a UserError."""
    if tp > 1 and requested != "fsdp":
        raise UserError(f"train.parallel.ep {ep} with train.parallel.tp {tp}: set train.distributed=fsdp (FSDP2 across "
                        f"the tensor-parallel groups, whose places each split the experts), not {requested}")
    if requested not in ("auto", "ddp", "fsdp"):
        raise UserError(f"train.parallel.ep {ep}: train.distributed must be auto, ddp or fsdp (the expert-parallel "
                        f"processes read different rows), not {requested}")
    _needs_launch_of(f"train.parallel.ep {ep}", multiple=ep * tp, world=world,
                     counted=f"{ep} x tp {tp} = {ep * tp}" if tp > 1 else None)
    return "ddp" if requested == "auto" else requested


def _needs_launch_of(setting: str, *, multiple: int, world: int, counted: str | None = None) -> None:
    """A UserError unless torchrun launched a multiple of ``multiple`` processes (``counted``: that number, in words)."""
    if "RANK" not in os.environ or world % multiple:
        raise UserError(f"{setting} needs a multiple of {counted or multiple} processes launched by torchrun "
                        f"(now {world if 'RANK' in os.environ else 'none'}), e.g. "
                        f"torchrun --standalone --nproc_per_node={multiple} -m specformer.cli train SPEC")


def device_for(requested: str, ctx: DistContext) -> torch.device:
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


def init_distributed(mode: str, *, tp: int = 1, ep: int = 1, cp: int = 1) -> DistContext:
    """Join the process group torchrun set up (nothing to do for ``none``)."""
    if mode == "none":
        return DistContext()
    ctx = DistContext(mode=mode, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                      local_rank=int(os.environ.get("LOCAL_RANK", "0")), tp=tp, ep=ep, cp=cp)
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(minutes=30))
    return ctx


def shutdown(ctx: DistContext) -> None:
    if ctx.enabled and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: nn.Module, ctx: DistContext, device: torch.device) -> nn.Module:
    """The module the training loop calls: the model itself, a DDP wrapper, or the model sharded or split in place."""
    dp_mesh = None
    if ctx.tp > 1:
        # late: only tensor-parallel runs need the plans' machinery
        from torch.distributed.device_mesh import init_device_mesh

        from specformer_train.parallel.tensor import apply_tensor_parallel, copied_rows

        mesh = init_device_mesh(device.type, (ctx.dp_size, ctx.tp), mesh_dim_names=("dp", "tp"))
        dp_mesh = mesh["dp"]
        if ctx.sequence_parallel:
            # late: only sequence-parallel runs need its DTensor moves
            from specformer_train.parallel.sequence import SequenceSplit

            ctx.sequence = SequenceSplit(mesh["tp"])
        try:
            ctx.layout, ctx.tp_summed = apply_tensor_parallel(model, mesh=mesh["tp"], sequence=ctx.sequence)
            ctx.tp_mesh = mesh["tp"]
            ctx.tp_copies = copied_rows(model)
        except ValueError as exc:
            raise UserError(f"train.parallel.tp {ctx.tp}: {exc}") from None
    if ctx.cp > 1:
        # late: only context-parallel runs need the mesh
        from torch.distributed.device_mesh import init_device_mesh

        ctx.cp_group = init_device_mesh(device.type, (ctx.dp_size, ctx.cp), mesh_dim_names=("dp", "cp"))["cp"].get_group()
        ctx.layout = f"context parallel {ctx.cp} ways: each process takes 2 of every row's {2 * ctx.cp} chunks"
    experts: set[nn.Parameter] = set()  # split over expert parallelism: kept out of the data-parallel average
    if ctx.ep > 1:
        # late: only expert-parallel runs need its groups
        from specformer_train.parallel.expert import apply_expert_parallel, new_expert_groups

        group, replicas = new_expert_groups(world=ctx.world_size, ep=ctx.ep, rank=ctx.rank, tp=ctx.tp)
        ctx.experts = apply_expert_parallel(model, group=group, replicas=replicas)
        ctx.layout = f"{ctx.layout}; {ctx.experts.text}" if ctx.layout else ctx.experts.text
        experts = set(ctx.experts.params.values())
    if ctx.mode == "ddp":
        if experts:
            nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
                model, list(ctx.experts.params))
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if ctx.mode == "fsdp":
        # late: only FSDP runs need the device mesh and fully_shard
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = dp_mesh if dp_mesh is not None else init_device_mesh(device.type, (ctx.world_size,))
        # Expert stacks stay whole on their process: split over ep (and, with replicas, all-reduced across them).
        for block in model.blocks:
            fully_shard(block, mesh=mesh, ignored_params=experts or None)
        fully_shard(model, mesh=mesh, ignored_params=experts or None)
    return model


@contextlib.contextmanager
def gradient_sync(wrapped: nn.Module, ctx: DistContext, *, sync: bool) -> Iterator[None]:
    """Skip the gradient all-reduce on micro-steps before the last of an accumulation."""
    if ctx.mode == "ddp" and not sync:
        with wrapped.no_sync():
            yield
        return
    if ctx.mode == "fsdp":
        wrapped.set_requires_gradient_sync(sync)
    yield


def optimizer_step_scope(ctx: DistContext) -> contextlib.AbstractContextManager:
    """Where the optimizer steps: under tensor parallelism (or FSDP beside expert parallelism), split (DTensor) and
    plain parameters meet in the same fused updates, which DTensor allows only when plain tensors count as
    replicated."""
    if ctx.tp == 1 and not (ctx.ep > 1 and ctx.mode == "fsdp"):  # FSDP's DTensors beside whole expert stacks too
        return contextlib.nullcontext()
    # late: only tensor-parallel runs need DTensors
    from torch.distributed.tensor.experimental import implicit_replication

    return implicit_replication()


def all_reduce_mean(value: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """The mean of ``value`` over processes (``value`` itself when not distributed)."""
    if not ctx.enabled:
        return value
    out = value.detach().clone()
    dist.all_reduce(out, op=dist.ReduceOp.SUM)
    return out / ctx.world_size


def any_process(flag: bool, ctx: DistContext, device: torch.device) -> bool:
    """True when ``flag`` is true on any process (so that all stop at the same step)."""
    if not ctx.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def shared_tag(ctx: DistContext, device: torch.device) -> str:
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


def barrier(ctx: DistContext) -> None:
    if ctx.enabled:
        dist.barrier()

