"""Split, wrap and compile a model for its layout, in one fixed order (torchtitan's ``parallelize_llama`` is the model).

:func:`parallelize` applies, top to bottom:

1. tensor parallelism, with sequence parallelism beside it (``train.parallel.tp``,
   ``sequence_parallel``): each block component split as its ``parallel_plan`` declares;
2. context parallelism (``train.parallel.cp``): the model stays whole; each step hands it
   this process' tokens and a cache gathering the group's keys (the trainer's ``_my_tokens``);
3. expert parallelism (``train.parallel.ep``): each mixture's experts split over their group;
4. activation checkpointing (``train.activation_checkpointing``): every block recomputed in
   the backward, around the split layers;
5. compilation (``train.compile``), of the model the splits and recomputation made;
6. data parallelism: FSDP2 (``fully_shard`` on each block, then on the model) or DDP, over
   the processes that read different rows; expert stacks are kept out of both, their
   gradients finished after the backward (:func:`specformer_train.parallel.expert.finish_expert_gradients`).

What the splits leave to do after each backward (gradients summed over a group, copied
rows, expert stacks) is handed back in the :class:`ParallelModel`, which no one changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from specformer.errors import UserError
from specformer_train.parallel.layout import DeviceMeshes, ParallelLayout
from specformer_train.recompute import enable_activation_checkpointing


@dataclass(frozen=True)
class ParallelModel:
    """The model as the training loop calls it, and what its splits leave to the end of each backward."""

    wrapped: nn.Module  # the model itself, a DDP wrapper, or the model sharded or split in place
    description: str = ""  # how the model is split across processes, in words ("" when it is not)
    tp_summed: tuple[str, ...] = ()  # parameters whose gradients are summed over tp (parallel_plan.Shared)
    tp_copies: dict[str, Tensor] = field(default_factory=dict)  # fused parameters holding copied key/value heads
    sequence: Any = None  # the switch and moves of sequence parallelism (sequence.SequenceSplit)
    experts: Any = None  # the expert-parallel groups and split parameters (expert.ExpertLayout)

    def check_optimizer(self, optimizer: torch.optim.Optimizer, layout: ParallelLayout) -> None:
        """A UserError when ``optimizer`` would update a split weight otherwise than one process holding it whole."""
        if self.experts is not None:
            from specformer_train.parallel.expert import refuse_coupled_updates  # late: only EP runs need it

            refuse_coupled_updates(optimizer, self.experts)
        if self.tp_copies and any(group.get("use_muon") for group in optimizer.param_groups):
            raise UserError(f"train.parallel.tp {layout.tp}: key/value heads fewer than tp are copied on the "
                            f"processes, and muon would orthogonalise the matrix with its copies "
                            f"({next(iter(self.tp_copies))}); use adamw, lion or sgd, or a tp that divides the "
                            f"key/value heads")


def parallelize(model: nn.Module, layout: ParallelLayout, *, device: torch.device,
                activation_checkpointing: bool = False, compile: bool = False) -> ParallelModel:
    """``model`` (a Decoder on ``device``) split, recomputed, compiled and wrapped for ``layout``, in that order."""
    said: list[str] = []

    # 1. tensor parallelism, and sequence parallelism beside it
    tp_summed: tuple[str, ...] = ()
    tp_copies: dict[str, Tensor] = {}
    sequence = None
    if layout.tp > 1:
        # late: only tensor-parallel runs need the plans' machinery (DTensor styles)
        from specformer_train.parallel.sequence import SequenceSplit
        from specformer_train.parallel.tensor import apply_tensor_parallel, copied_rows

        tp_mesh = _meshes(layout).tp
        sequence = SequenceSplit(tp_mesh) if layout.sequence_parallel else None
        try:
            text, tp_summed = apply_tensor_parallel(model, mesh=tp_mesh, sequence=sequence)
        except ValueError as exc:
            raise UserError(f"train.parallel.tp {layout.tp}: {exc}") from None
        tp_copies = copied_rows(model)
        said.append(text)

    # 2. context parallelism: nothing in the model changes (the trainer hands each process its tokens)
    if layout.cp > 1:
        said.append(f"context parallel {layout.cp} ways: each process takes 2 of every row's {2 * layout.cp} chunks")

    # 3. expert parallelism
    experts = None
    if layout.ep > 1:
        from specformer_train.parallel.expert import apply_expert_parallel  # late: only expert-parallel runs need it

        meshes = _meshes(layout)
        experts = apply_expert_parallel(model, group=meshes.experts, replicas=meshes.expert_replicas)
        said.append(experts.text)

    # 4. activation checkpointing
    if activation_checkpointing:
        enable_activation_checkpointing(model)

    # 5. compilation (lazy: torch compiles at the first forward)
    if compile:
        model.compile()

    # 6. data parallelism
    wrapped = _data_parallel(model, layout, device, experts=experts.params if experts is not None else {})
    return ParallelModel(wrapped=wrapped, description="; ".join(said), tp_summed=tp_summed, tp_copies=tp_copies,
                         sequence=sequence, experts=experts)


def _data_parallel(model: nn.Module, layout: ParallelLayout, device: torch.device, *,
                   experts: dict[str, nn.Parameter]) -> nn.Module:
    """DDP around ``model``, or ``model`` sharded by FSDP2 in place (or as it is); ``experts`` (split expert stacks by
    name) stay whole on their process, kept out of the average."""
    if layout.mode == "ddp":
        if experts:
            nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, list(experts))
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if layout.mode == "fsdp":
        from torch.distributed.fsdp import fully_shard  # late: only FSDP runs need it

        mesh = _meshes(layout).sharded
        ignored = set(experts.values()) or None  # expert stacks stay whole on their process, split over ep
        # An MTP depth's block is sharded as a main block is; the rest of the depth stays with the root, since the
        # Decoder runs the depth's final norm outside the depth's forward (after FSDP would have resharded it).
        depth_blocks = [depth.block for depth in getattr(model, "mtp", None) or []]
        for block in [*model.blocks, *depth_blocks]:
            fully_shard(block, mesh=mesh, ignored_params=ignored)
        fully_shard(model, mesh=mesh, ignored_params=ignored)
    return model


def _meshes(layout: ParallelLayout) -> DeviceMeshes:
    if layout.meshes is None:
        raise ValueError("the layout's meshes are built once the process group is joined (ParallelLayout.with_meshes)")
    return layout.meshes


__all__ = ["ParallelModel", "parallelize"]
