"""The layout of a run's processes: one immutable object, its degrees checked once, its meshes built once.

``train.parallel`` names the degrees (``tp``, ``cp``, ``ep``, ``sequence_parallel``) and
``train.distributed`` how the data-parallel replicas hold the model (ddp or fsdp);
:meth:`ParallelLayout.of_launch` checks them against the processes torchrun launched,
every misfit a :class:`~specformer.errors.UserError` saying what to set. Ranks are laid
out ``[dp][cp][tp]``: the ``tp`` consecutive processes split each component, ``cp``
groups of them split each row's tokens, and the ``dp`` groups of those read different
rows. Expert parallelism borrows its processes from ``dp`` (at each tensor-parallel
place: :func:`specformer_train.parallel.expert.group_ranks`).

:meth:`ParallelLayout.with_meshes` builds, once the process group is joined, the one world
mesh ``(dp, cp, tp)`` and every sub-mesh and group the splits use (:class:`DeviceMeshes`);
it hands back a new layout, so no one changes a layout after it is made.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

from specformer.errors import UserError

MODES = ("none", "ddp", "fsdp", "tp")


@dataclass(frozen=True, kw_only=True)
class DeviceMeshes:
    """The world mesh ``(dp, cp, tp)`` of a run and the sub-meshes and groups each split reads of it."""

    world: Any = None  # DeviceMesh, dims ("dp", "cp", "tp"); None for plain DDP, which averages over the default group
    dp: Any = None  # its sub-meshes: the processes reading different rows,
    cp: Any = None  # those splitting each row's tokens,
    tp: Any = None  # and those splitting each component
    sharded: Any = None  # what FSDP2 shards over: dp, or dp and cp together (each row's groups shard too)
    experts: Any = None  # this process' expert-parallel group (a ProcessGroup), with ep > 1
    expert_replicas: Any = None  # the processes holding the same experts, None when there is one replica


@dataclass(frozen=True, kw_only=True)
class ParallelLayout:
    """Who this process is in the run, how the processes are laid out, and (once joined) their meshes."""

    mode: str = "none"  # none | ddp | fsdp | tp: how the data-parallel replicas hold the model
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    tp: int = 1  # processes splitting each component (train.parallel.tp); they read the same rows
    ep: int = 1  # processes splitting each mixture's experts (train.parallel.ep); they read different rows
    cp: int = 1  # processes splitting each row's tokens (train.parallel.cp); they read the same rows
    sequence_parallel: bool = False  # train.parallel.sequence_parallel: the stream cut by sequence between sublayers
    meshes: DeviceMeshes | None = field(default=None, compare=False)  # built by with_meshes

    def __post_init__(self) -> None:
        # A programming error, not a user's: of_launch refuses every misfit of the settings with a message.
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {MODES}")
        if min(self.tp, self.ep, self.cp) < 1 or self.world_size % (self.tp * self.cp):
            raise ValueError(f"{self.world_size} processes cannot be laid out with tp {self.tp}, cp {self.cp}")

    @classmethod
    def of_launch(cls, *, distributed: str, tp: int = 1, ep: int = 1, cp: int = 1,
                  sequence_parallel: bool = False) -> ParallelLayout:
        """This process' layout under the launch torchrun made (one process without it), every setting checked."""
        mode = resolve_mode(distributed, tp=tp, ep=ep, cp=cp)
        if mode == "none":
            return cls(sequence_parallel=sequence_parallel)
        return cls(mode=mode, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                   local_rank=int(os.environ.get("LOCAL_RANK", "0")), tp=tp, ep=ep, cp=cp,
                   sequence_parallel=sequence_parallel)

    def with_meshes(self, device_type: str) -> ParallelLayout:
        """This layout with its meshes built (every process calls this, in the same order), after the process group
        is joined; unchanged when not distributed."""
        if not self.enabled:
            return self
        # late: only a distributed run builds meshes, and importing them needs torch.distributed
        from torch.distributed.device_mesh import init_device_mesh

        from specformer_train.parallel.expert import new_expert_groups

        meshes: dict[str, Any] = {}
        if self.mode == "fsdp" or self.tp > 1 or self.cp > 1:  # plain DDP averages over the default group: no mesh
            world = init_device_mesh(device_type, (self.dp_size, self.cp, self.tp), mesh_dim_names=("dp", "cp", "tp"))
            # FSDP2 shards over every process that holds the same split: dp, and cp's groups too (as torchtitan's
            # dp_shard_cp), so that their gradients are averaged as data parallelism averages them.
            sharded = world["dp", "cp"]._flatten("dp_cp") if self.cp > 1 else world["dp"]
            meshes.update(world=world, dp=world["dp"], cp=world["cp"], tp=world["tp"], sharded=sharded)
        if self.ep > 1:
            meshes["experts"], meshes["expert_replicas"] = new_expert_groups(world=self.world_size, ep=self.ep,
                                                                              rank=self.rank, tp=self.tp)
        return dataclasses.replace(self, meshes=DeviceMeshes(**meshes))

    @property
    def dp_size(self) -> int:
        """How many processes read different rows of each global batch."""
        return self.world_size // (self.tp * self.cp)

    @property
    def dp_rank(self) -> int:
        """This process' place among those that read different rows: ranks are laid out ``[dp][cp][tp]``."""
        return self.rank // (self.tp * self.cp)

    @property
    def cp_rank(self) -> int:
        """This process' place in its context-parallel group (which of each row's chunks it takes)."""
        return (self.rank // self.tp) % self.cp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def mesh(self) -> dict[str, Any]:
        """How this run lays its processes out, as recorded in every checkpoint's ``trainer.json`` (``extra.mesh``)."""
        return {"processes": self.world_size, "distributed": self.mode, "dp": self.dp_size, "tp": self.tp, "ep": self.ep,
                "cp": self.cp}

    def check_model(self, model: Any, *, seq_len: int, documents: dict[str, bool], masked_loss: bool) -> None:
        """A UserError naming what this layout cannot split in ``model`` trained on rows of ``seq_len`` tokens."""
        if self.sequence_parallel:
            # late: the checks import DTensor's styles, which a run without these splits never needs
            from specformer_train.parallel.sequence import check_sequence_parallel

            try:
                check_sequence_parallel(model, tp=self.tp, seq_len=seq_len)
            except ValueError as exc:
                raise UserError(f"train.parallel.sequence_parallel: {exc}") from None
        if self.cp > 1:
            from specformer_train.parallel.context import check_context_parallel  # late: as above

            check_context_parallel(model, cp=self.cp, seq_len=seq_len, documents=documents, masked_loss=masked_loss)


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


__all__ = ["DeviceMeshes", "ParallelLayout", "launched_world_size", "resolve_mode"]
