"""The parallel plan on paper: memory and communication per device for a layout of tp, ep, cp and FSDP.

``plan_parallel(shape, layout, ...)`` reads the :mod:`specformer.model.parallel_plan`
declarations of a model built on the meta device (:func:`specformer.spec.check.estimate`)
and works out, per device:

* the layout (torchtitan's, with expert tensor parallel 1): ``dp_replicate x dp_shard x cp x tp``
  devices, ``cp`` splitting each row's tokens (context parallel: FSDP shards across its
  devices too, as torchtitan's ``dp_shard_cp``); ``ep`` borrows its devices from the
  ``dp_shard x cp x tp`` ones (it must divide their product), so an expert weight is cut
  ``ep`` ways by expert and its remaining ``dp_shard x cp x tp / ep`` ways by FSDP, and
  experts are never split inside (no tp within an expert); every other weight is cut ``tp``
  ways as its component declares, then ``dp_shard x cp`` ways by FSDP along its first
  dimension (padded up, as FSDP2 does).
* memory: parameters and gradients in the training precision; AdamW's two fp32 moments,
  plus an fp32 master copy of the weights when training in bf16; activations kept for
  backward for ``batch`` sequences of ``seq`` tokens per data-parallel rank (a ``cp``-th of
  each on one device), with and without full activation checkpointing (one checkpoint per
  layer).
* communication per optimizer step (bytes each device sends; a ring moves ``(g-1)/g`` of
  a buffer per all-gather or reduce-scatter, twice that per all-reduce): FSDP's all-gather of
  the weights in forward and again in backward, and reduce-scatter of the gradients (in
  fp32); tensor parallel's all-gather and reduce-scatter of the layer input around every
  tp-split sublayer (sequence parallel: the norms see 1/tp of the tokens), forward and
  backward, and of the embedding and head when they split by vocabulary; expert parallel's
  all-to-all dispatch and combine of each token's ``top_k`` copies, forward and backward;
  context parallel's gather of every attention layer's keys and values (what its cache
  slots hold) in forward and the all-reduce of their gradients in backward (as the trainer
  does it, :mod:`specformer_train.parallel.context`); and the all-reduce of the gradients
  across ``dp_replicate``.

The activation rule is generic, so it holds for any component: every matmul keeps its
input and its output for backward (its output is what the next norm, activation or
attention kernel keeps), an expert matmul once per routed copy (``top_k``), and attention
runs a fused kernel that keeps no ``T x T`` scores. With tp and sequence parallelism every
kept activation is split ``tp`` ways (Korthikanti et al. 2022, arXiv:2205.05198). The fp32
logits of the loss are counted once, vocabulary-parallel when the embedding and head split.

Whether they split (a tied head, a padded vocabulary keep them whole; a vocabulary ``tp``
does not divide splits unevenly) is :func:`specformer.model.parallel_plan.vocabulary_split`,
the rule the trainer applies too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from specformer.errors import UserError
from specformer.messages import format_bytes
from specformer.model.attention import cache_slots_of
from specformer.model.parallel_plan import ParallelPlan, Split, declared_splits, plan_of, vocabulary_of
from specformer.model.state import state_slots_of

#: The axes ``--parallel`` accepts, in the order they are printed.
AXES = ("tp", "ep", "cp", "dp_shard", "dp_replicate")


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1
    cp: int = 1
    dp_shard: int = 1
    dp_replicate: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.dp_shard * self.dp_replicate

    @property
    def fsdp(self) -> int:
        """How many ways FSDP cuts a dense weight: the FSDP shards and the context-parallel devices."""
        return self.dp_shard * self.cp

    @property
    def expert_fsdp(self) -> int:
        """How many ways FSDP cuts an expert's weights: the devices of dp_shard x cp x tp that ep leaves."""
        return self.dp_shard * self.cp * self.tp // self.ep

    def describe(self) -> str:
        return ",".join(f"{a}={getattr(self, a)}" for a in AXES)


def parse_layout(text: str) -> Layout:
    """``tp=8,ep=8,dp_shard=16`` -> Layout; UserError naming what is wrong and what is accepted."""
    sizes: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        axis, eq, value = item.partition("=")
        axis = axis.strip()
        if not eq:
            raise UserError(f"--parallel: {item!r} is not AXIS=SIZE (e.g. tp=8,ep=8,dp_shard=16)")
        if axis not in AXES:
            hint = " (pipeline parallelism is not planned yet)" if axis == "pp" else ""
            raise UserError(f"--parallel: unknown axis {axis!r}{hint}; accepted: {', '.join(AXES)}")
        if axis in sizes:
            raise UserError(f"--parallel: {axis} is given twice")
        try:
            size = int(value.strip())
        except ValueError:
            raise UserError(f"--parallel: {axis}={value.strip()!r} is not a whole number") from None
        if size < 1:
            raise UserError(f"--parallel: {axis}={size} must be at least 1")
        sizes[axis] = size
    layout = Layout(**sizes)
    if (layout.fsdp * layout.tp) % layout.ep:
        raise UserError(f"--parallel: ep={layout.ep} must divide dp_shard x cp x tp = {layout.fsdp * layout.tp} "
                        f"(expert parallelism borrows its devices from the FSDP shards and the tp group)")
    return layout


@dataclass
class ParallelReport:
    """Per device, in bytes: what a layout costs a model (see the module's docstring)."""

    layout: Layout
    dtype: str  # "bf16" or "fp32": the training precision
    dtype_source: str  # where it came from: "--dtype", "the spec's train.precision", "the default"
    batch: int
    seq: int
    split: list[str] = field(default_factory=list)  # "mixer (LatentAttention): q_b, kv_b, out over tp by heads"
    vocabulary: str = ""  # "embedding and head by vocabulary", "embedding and head whole (tied)"
    undeclared: list[str] = field(default_factory=list)  # components with no plan: "mixer (GatedDeltaNet)"
    parameter_elements: int = 0  # per device, after tp/ep and FSDP
    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    activations_checkpointed: int = 0
    comm: dict[str, int] = field(default_factory=dict)

    @property
    def memory(self) -> int:
        return self.parameters + self.gradients + self.optimizer

    def to_dict(self) -> dict[str, Any]:
        return {"layout": {a: getattr(self.layout, a) for a in AXES}, "devices": self.layout.devices,
                "dtype": self.dtype, "batch": self.batch, "seq": self.seq,
                "split": self.split, "vocabulary": self.vocabulary, "replicated_without_plan": self.undeclared,
                "bytes_per_device": {"parameters": self.parameters, "gradients": self.gradients,
                                     "optimizer": self.optimizer, "activations": self.activations,
                                     "activations_checkpointed": self.activations_checkpointed},
                "comm_bytes_per_step_per_device": dict(self.comm)}


def plan_parallel(shape: Any, layout: Layout, *, dtype: str = "bf16", dtype_source: str = "the default",
                  batch: int = 1, seq: int | None = None) -> ParallelReport:
    """The report for ``shape`` (a :class:`specformer.model.sizes.SizeEstimate`) laid out as ``layout``."""
    skeleton = shape.skeleton
    seq = seq if seq is not None else skeleton.context_length
    width = 2 if dtype == "bf16" else 4
    r = ParallelReport(layout=layout, dtype=dtype, dtype_source=dtype_source, batch=batch, seq=seq)
    tokens = batch * seq / layout.cp  # per device: its data-parallel rank's rows, a cp-th of each
    d_model = skeleton.embedding.weight.shape[1]
    local_bytes = {"dense": 0, "experts": 0}  # tp/ep-split weights before FSDP, per device (all layers)
    sharded = {"dense": 0, "experts": 0}  # elements per device after FSDP

    def account(name: str, p: torch.Tensor, splits: tuple[Split, ...], count: int) -> None:
        local = _local_shape(name, p, splits, layout)
        experts = any(s.axis == "ep" for s in splits)
        fsdp = layout.expert_fsdp if experts else layout.fsdp
        kind = "experts" if experts else "dense"
        local_bytes[kind] += math.prod(local) * width * count
        # FSDP2 cuts the first dimension, the last shard padded up (a scalar stays whole).
        sharded[kind] += (math.ceil(local[0] / fsdp) * math.prod(local[1:]) if local else 1) * count

    vocabulary = vocabulary_of(skeleton, layout.tp)
    r.vocabulary = vocabulary.describe()
    head_plan = vocabulary.plan()
    for part, module in skeleton.named_children():
        if part == "blocks":
            continue
        declared = head_plan if part in ("embedding", "lm_head") else None
        for name, p, splits in _declared(part, module, r, declared):
            account(f"{part}.{name}", p, splits, 1)
    activation_per_layer: list[tuple[int, int]] = []  # (elements kept per token, layers)
    tp_sublayers = moe_copies = 0  # per step: tp-split sublayers; MoE layers x top_k
    keys_per_token = 0  # elements of keys and values every attention layer keeps per token, on one tp device
    for block, count in shape.blocks:
        keys_per_token += _keys_per_token(getattr(block, "mixer", None), layout.tp) * count
        for part, module in block.named_children():
            splits_here = list(_declared(part, module, r, None))
            for name, p, splits in splits_here:
                account(f"{part}.{name}", p, splits, count)
            if any(s.axis == "tp" for _, _, splits in splits_here for s in splits):
                tp_sublayers += count
            if any(s.axis == "ep" for _, _, splits in splits_here for s in splits):
                moe_copies += int(getattr(module, "top_k", 1)) * count
        activation_per_layer.append((_kept_per_token(block), count))

    elements = sharded["dense"] + sharded["experts"]
    r.parameter_elements = elements
    r.parameters = elements * width
    r.gradients = elements * width
    r.optimizer = elements * 4 * (3 if dtype == "bf16" else 2)  # two fp32 moments (+ fp32 master weights)

    tp = layout.tp
    # fp32 logits of the loss: this device's vocabulary rows when split, else all of them
    logits = math.ceil(tokens * (math.ceil(vocabulary.rows / tp) if vocabulary.split else vocabulary.rows) * 4)
    layers_kept = sum(kept * n for kept, n in activation_per_layer)
    r.activations = math.ceil(tokens * layers_kept * width / tp) + logits
    inputs_kept = sum(n for _, n in activation_per_layer) * d_model  # one checkpoint (the layer input) per layer
    one_layer = max((kept for kept, _ in activation_per_layer), default=0)  # recomputed one layer at a time
    r.activations_checkpointed = math.ceil(tokens * (inputs_kept + one_layer) * width / tp) + logits

    ring = lambda g: (g - 1) / g  # noqa: E731 - a ring all-gather or reduce-scatter moves this share
    fsdp_dense, fsdp_experts = layout.fsdp, layout.expert_fsdp
    gather = 2 * (ring(fsdp_dense) * local_bytes["dense"] + ring(fsdp_experts) * local_bytes["experts"])
    reduce = (ring(fsdp_dense) * local_bytes["dense"] + ring(fsdp_experts) * local_bytes["experts"]) * 4 / width
    activation = tokens * d_model * width  # one layer input of this rank's tokens, unsplit
    r.comm = {
        "fsdp all-gather (weights, forward + backward)": round(gather),
        "fsdp reduce-scatter (gradients, fp32)": round(reduce),
        # Sequence parallel: per tp-split sublayer an all-gather in and a reduce-scatter out, forward and backward;
        # the embedding and head one pair each when split by vocabulary (whole, they compute alone).
        "tp all-gather + reduce-scatter (layer inputs)": round(
            4 * (tp_sublayers + vocabulary.split) * ring(tp) * activation),
        "ep all-to-all (tokens, dispatch + combine)": round(4 * moe_copies * ring(layout.ep) * activation / tp),
        # Context parallel: every attention layer gathers the whole rows' keys and values in forward and sums their
        # gradients in backward (an all-reduce: twice the bytes of a gather).
        "cp all-gather (keys + values, fwd + bwd)": round(
            3 * ring(layout.cp) * batch * seq * keys_per_token * width),
        "dp_replicate all-reduce (gradients, fp32)": round(2 * ring(layout.dp_replicate) * elements * 4),
    }
    return r


def _keys_per_token(attention: Any, tp: int) -> int:
    """Elements of the keys and values (what its cache slots hold) a layer keeps per token on one tp device."""
    slots = cache_slots_of(attention) if attention is not None and state_slots_of(attention) is None else None
    if slots is None:  # no attention, one reading another layer's keys (kv_from), or a state kept instead
        return 0
    # heads split over tp; fewer than tp are copied, one per device
    return sum(max(1, heads // tp) * dim for heads, dim in ((slots.key_heads, slots.key_dim),
                                                            (slots.value_heads, slots.value_dim)))


def _declared(part: str, component: nn.Module, r: ParallelReport,
              plan: ParallelPlan | None) -> Iterator[tuple[str, torch.Tensor, tuple[Split, ...]]]:
    """Each parameter of a component with its splits; notes in ``r`` what was split and what had no plan."""
    label = f"{part} ({type(component).__name__})"
    parameters = dict(component.named_parameters())
    walked = list(declared_splits(component, plan))
    if walked and all(owner is None for _, owner, _, _ in walked) and label not in r.undeclared:
        r.undeclared.append(label)
    described: dict[str, list[str]] = {}
    for name, _, _, splits in walked:
        p = parameters[name]
        for s in splits:
            if getattr(r.layout, s.axis) == 1:  # declared, but this layout does not cut along it
                continue
            described.setdefault(f"over {s.axis} by {s.what}", []).append(name.removesuffix(".weight"))
        yield name, p, splits
    for how, names in described.items():
        line = f"{label}: {', '.join(dict.fromkeys(names))} {how}"
        if line not in r.split:
            r.split.append(line)


def _local_shape(name: str, p: torch.Tensor, splits: tuple[Split, ...], layout: Layout) -> list[int]:
    """The parameter's shape on one device after its tp/ep splits; UserError when a size does not divide."""
    shape = list(p.shape)
    if not splits:
        return shape
    dim = splits[0].dim
    covered = kept = 0
    for s in splits:
        size = getattr(layout, s.axis)
        rows = s.rows if s.rows is not None else shape[dim]
        covered += rows
        if s.units % size == 0:
            kept += rows // size
        elif s.uneven:
            kept += math.ceil(rows / size)  # the first devices' share; the last keeps fewer
        elif s.copies_when_fewer and size % s.units == 0:
            kept += rows // s.units  # one unit per device, copied size / units times
        else:
            accepted = "divide" if not s.copies_when_fewer else "divide or be a multiple of"
            raise UserError(f"--parallel: {s.axis}={size} must {accepted} the {s.units} {s.what} of {name}")
    shape[dim] = kept + (shape[dim] - covered)  # rows no segment covers stay whole
    return shape


def _kept_per_token(block: nn.Module) -> int:
    """Elements one token leaves for backward in a block: every matmul's input and output (experts: per copy)."""
    kept = 0
    for module in block.modules():
        if isinstance(module, nn.Linear):
            kept += module.in_features + module.out_features
        declared = plan_of(module) or {}
        for name, p in module.named_parameters(recurse=False):
            if p.dim() == 3 and any(s.axis == "ep" for s in declared.get(name, ())):
                kept += int(getattr(module, "top_k", 1)) * (p.shape[1] + p.shape[2])  # (E, out, in) per copy
    return kept


def format_parallel(r: ParallelReport) -> str:
    """The report as the lines ``specformer summary --parallel`` prints under the summary."""
    L = r.layout
    master = " + fp32 master weights" if r.dtype == "bf16" else ""
    lines = ["", f"parallel plan on paper: {L.describe()} -> {L.devices} devices "
                 f"(ep within dp_shard x cp x tp; no tp inside an expert)"]
    lines += [f"  split: {line}" for line in r.split]
    if L.tp > 1:
        lines.append(f"  vocabulary: {r.vocabulary}")
    lines += [f"  replicated (no parallel_plan declared): {label}" for label in r.undeclared]
    lines.append(f"memory per device ({r.dtype} training, from {r.dtype_source}; AdamW: two fp32 moments{master}):")
    rows = [("parameters", r.parameters), ("gradients", r.gradients), ("optimizer state", r.optimizer),
            ("weights + grads + optimizer", r.memory)]
    lines += [f"  {k:<30}{format_bytes(v)}" for k, v in rows]
    lines.append(f"  {'activations':<30}{format_bytes(r.activations)} without checkpointing, "
                 f"{format_bytes(r.activations_checkpointed)} with a checkpoint per layer "
                 f"(batch {r.batch} x seq {r.seq:,} per data-parallel rank, fp32 logits included)")
    lines.append("communication per step per device (bytes sent):")
    lines += [f"  {k:<48}{format_bytes(v)}" for k, v in r.comm.items()]
    lines.append("  (a plan on paper; training applies tp with sequence parallelism, ep and cp: train.parallel)")
    return "\n".join(lines)


__all__ = ["AXES", "Layout", "ParallelReport", "format_parallel", "parse_layout", "plan_parallel"]
