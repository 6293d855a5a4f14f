"""Sequence parallelism beside tensor parallelism: between the split sublayers, each process keeps its share of the tokens.

Under tensor parallelism alone every process holds the whole residual stream ``(B, T, D)``
and computes the norms, residual adds and any whole (unsplit) feed-forward on every token,
the same work and memory on each. ``train.parallel.sequence_parallel`` cuts the stream
along the sequence between sublayers (Korthikanti et al. 2022, arXiv:2205.05198): each
process keeps ``T / tp`` tokens of it, and

- a split sublayer (its components' ``parallel_plan`` cuts it over ``tp``) gathers the
  whole sequence on entry, and its row-split output layer sums the partial outputs by a
  reduce-scatter instead of an all-reduce, handing each process its tokens of the sum;
- the token mixer when it is whole (a recurrent mixer without a plan) gathers the whole
  sequence and keeps its tokens of the output;
- everything else in a block (norms, a whole feed-forward such as a mixture of experts
  with experts whole or split over ``ep``) computes on this process' tokens alone, so each
  process' gradient of those weights is a part, summed over the group after the backward;
- the stream is cut before the first block and gathered again before the final norm, so
  the head and the loss see every token.

The cuts and gathers are DTensor redistributions (shard on dim 1 <-> replicate), whose
backward moves gradients the other way. The split is active only while the trainer takes
the loss (:meth:`SequenceSplit.active`): sampling during training runs on whole sequences
like plain tensor parallelism.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import RowwiseParallel

from specformer.model.parallel_plan import declared_splits


class SequenceSplit:
    """The switch and the two moves of sequence parallelism over one tensor-parallel mesh."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.mesh = mesh
        self.on = False

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Inside: the stream is cut by sequence (a training or evaluation forward and its backward)."""
        self.on = True
        try:
            yield
        finally:
            self.on = False

    def cut(self, x: Tensor) -> Tensor:
        """``x`` ``(B, T, ...)``, whole on every process, to this process' tokens ``(B, T/tp, ...)``; the backward
        gathers the gradient."""
        return DTensor.from_local(x, self.mesh, [Replicate()], run_check=False).redistribute(
            placements=[Shard(1)]).to_local()

    def gather(self, x: Tensor) -> Tensor:
        """This process' tokens ``(B, T/tp, ...)`` to the whole sequence; the backward keeps this process' rows of the
        gradient (every process computes the same whole gradient after a gather)."""
        return DTensor.from_local(x, self.mesh, [Shard(1)], run_check=False).redistribute(
            placements=[Replicate()]).to_local()


class SequenceRowwise(RowwiseParallel):
    """Row-wise parallel whose partial outputs are reduce-scattered by sequence while ``split`` is on, else all-reduced."""

    def __init__(self, split: SequenceSplit) -> None:
        super().__init__()
        self.split = split

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        split = self.split
        module = super()._apply(module, device_mesh)
        module._sequence_split = split  # read by the output hook below, which the parent wires as a static method
        return module

    @staticmethod
    def _prepare_output_fn(output_layouts, use_local_output, mod, outputs, device_mesh):
        wanted = [Shard(1)] if mod._sequence_split.on else [Replicate()]
        return outputs.redistribute(placements=wanted).to_local()


def apply_sequence_parallel(model: nn.Module, split: SequenceSplit, *, split_parts: set[int]) -> tuple[str, ...]:
    """Wire the cuts and gathers into ``model`` (its blocks already split by tensor parallelism; ``split_parts``: ids
    of the block components split over tp). Returns the parameters whose gradients are summed over the group."""
    summed: list[str] = []
    model.blocks[0].register_forward_pre_hook(_on_first_argument(split, split.cut))
    model.final_norm.register_forward_pre_hook(_on_first_argument(split, split.gather))
    for index, block in enumerate(model.blocks):
        for name, part in block.named_children():
            if id(part) in split_parts:
                # its row-split output layer (SequenceRowwise) hands back this process' tokens
                part.register_forward_pre_hook(_on_first_argument(split, split.gather))
            elif name == "mixer":  # a whole token mixer reads every token
                part.register_forward_pre_hook(_on_first_argument(split, split.gather))
                part.register_forward_hook(_on_output(split, split.cut))
            else:  # norms, residual connections, a whole feed-forward: this process' tokens only
                summed += [f"blocks.{index}.{name}.{p}" for p, _ in part.named_parameters()]
    return tuple(summed)


def check_sequence_parallel(model: nn.Module, *, tp: int, seq_len: int) -> None:
    """A ValueError naming what sequence parallelism cannot cut in this model, if anything."""
    if seq_len % tp:
        raise ValueError(f"the stream is cut into tp = {tp} equal parts of every row, so train.seq_len ({seq_len}) "
                         f"must divide by {tp}")
    if getattr(model, "per_layer_input", None) is not None:
        raise ValueError("per-layer inputs (model.per_layer_input) are computed for every token, which a cut stream "
                         "does not hold")
    if any(True for _ in model.residual.parameters()):
        raise ValueError("a multi-stream residual (model.block.residual) widens the stream before the blocks and "
                         "narrows it after them, with the same weights on whole and cut streams")
    for index, block in enumerate(model.blocks):
        ffn = getattr(block, "ffn", None)
        if getattr(ffn, "reads_context", False):
            raise ValueError(f"layer {index}'s feed-forward reads the token ids (hash routing), which are whole, "
                             f"while it computes on this process' tokens")


def split_part_ids(model: nn.Module) -> set[int]:
    """Ids of the block components a tensor-parallel plan cut: those owning a split (DTensor) parameter themselves."""
    ids = set()
    for block in model.blocks:
        for _, part in block.named_children():
            walked = list(declared_splits(part))
            if any(owner is part and any(s.axis == "tp" for s in splits) for _, owner, _, splits in walked):
                ids.add(id(part))
    return ids


def _on_first_argument(split: SequenceSplit, move: Any) -> Any:
    def hook(module: nn.Module, args: tuple) -> tuple | None:
        if not split.on:
            return None
        return (move(args[0]), *args[1:])

    return hook


def _on_output(split: SequenceSplit, move: Any) -> Any:
    def hook(module: nn.Module, args: tuple, output: Tensor) -> Tensor | None:
        return move(output) if split.on else None

    return hook


__all__ = ["SequenceRowwise", "SequenceSplit", "apply_sequence_parallel", "check_sequence_parallel",
           "split_part_ids"]
