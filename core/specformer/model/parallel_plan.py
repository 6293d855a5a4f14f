"""How a component's weights split across devices: the declaration the parallel planner reads.

A built module may declare ``parallel_plan()``: a mapping from the names of its parameters
(relative to the module, as ``named_parameters`` gives them) to the :class:`Split` segments
of that parameter. A parameter the plan names with ``()``, or does not name at all, is
replicated by the module's choice (a norm's weight, latent attention's down-projections);
a submodule that declares a plan of its own (a mixture's shared experts) speaks for its
parameters instead. A component with no plan anywhere above its parameters is replicated
on every device, and ``specformer summary --parallel`` names it.

Two axes split weights: ``tp`` (tensor parallel: heads, hidden channels, vocabulary rows)
and ``ep`` (expert parallel: whole experts). Data parallel sharding (FSDP, ``dp_shard``)
needs no declaration: it cuts every parameter's first dimension, whatever the component.

A fused weight concatenates several things along one dimension (``qkv`` rows: queries,
keys, values); it declares one :class:`Split` per segment, in order, each with its own
``rows`` and ``units``. Key/value heads fewer than ``tp`` are copied, not split: each
device keeps the one head its query heads read (``copies_when_fewer``), as Megatron-LM
and torchtitan do.

Torch-free: a plugin's module imports only :class:`Split` from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Literal, Mapping

#: The axes a weight may split over.
WEIGHT_AXES = ("tp", "ep")

#: The attribute a fused projection carries once tensor parallelism split it per part
#: (:class:`specformer.model.tensor_parallel.FusedColwiseParallel`): gathered row i is real row order[i].
ROW_ORDER = "_tp_row_order"


@dataclass(frozen=True)
class Split:
    """One segment of a parameter's dimension ``dim``, cut over ``axis`` in whole ``units``.

    ``units`` are the pieces that may not be cut (heads, experts, hidden channels,
    vocabulary rows), named by ``what`` in messages; the axis' size must divide them,
    or, with ``copies_when_fewer``, be a multiple of them (each device then keeps one
    unit, copied ``size / units`` times). ``rows`` is the segment's extent along ``dim``
    when the parameter concatenates several segments; None: the whole dimension.
    """

    axis: Literal["tp", "ep"]
    dim: int
    units: int
    what: str
    rows: int | None = None
    copies_when_fewer: bool = False
    #: The axis' size need not divide the units: each device keeps ``ceil(units / size)`` of them, the last fewer
    #: (DTensor's ``Shard``, as vocabulary rows split).
    uneven: bool = False


@dataclass(frozen=True)
class Shared:
    """A weight every device of ``axis`` keeps whole but applies to its own share only.

    A norm applied to each query head, with ``tp`` splitting the heads, sees only that
    device's heads: each device's gradient is a part of the whole, so training sums them
    over the axis (after the backward, before clipping).
    """

    axis: Literal["tp", "ep"]


#: A module's plan: parameter name -> its segments (``()``: replicated by choice; ``(Shared(axis),)``: see :class:`Shared`).
ParallelPlan = Mapping[str, tuple["Split | Shared", ...]]


@dataclass(frozen=True)
class VocabularySplit:
    """How tensor parallelism lays out the decoder's embedding and output head: split by vocabulary rows, or whole.

    Made by :func:`vocabulary_split`, the one rule both ``specformer summary --parallel``
    and the trainer's tensor parallelism read.
    """

    split: bool
    rows: int  # the embedding's rows (the padded vocabulary)
    why_whole: str | None = None  # "tied", "padded vocabulary", "fewer vocabulary rows than tp"

    def describe(self) -> str:
        return "embedding and head by vocabulary" if self.split else f"embedding and head whole ({self.why_whole})"

    def plan(self) -> ParallelPlan:
        """The plan of the embedding and of the head (each has ``weight``, the head maybe ``bias``)."""
        if not self.split:
            return {"weight": (), "bias": ()}
        rows = (Split("tp", 0, self.rows, "vocabulary rows", uneven=True),)
        return {"weight": rows, "bias": rows}


def vocabulary_split(*, vocab_size: int, padded_vocab_size: int, tied: bool, tp: int) -> VocabularySplit:
    """Whether tensor parallelism over ``tp`` processes splits the embedding and head by vocabulary rows.

    Split unless: the head is tied (it reads the embedding's weight in a plain matmul, which a
    split weight would not enter); the vocabulary is padded (the logits are cut back to the
    vocabulary, which split logits cannot be without gathering them); or there are fewer
    rows than processes. A ``tp`` that does not divide the rows splits them unevenly (259
    rows over 2: 130 and 129).
    """
    if tied:
        return VocabularySplit(split=False, rows=padded_vocab_size, why_whole="tied")
    if padded_vocab_size != vocab_size:
        return VocabularySplit(split=False, rows=padded_vocab_size, why_whole="padded vocabulary")
    if padded_vocab_size < tp:
        return VocabularySplit(split=False, rows=padded_vocab_size, why_whole="fewer vocabulary rows than tp")
    return VocabularySplit(split=True, rows=padded_vocab_size)


def vocabulary_of(decoder: Any, tp: int) -> VocabularySplit:
    """:func:`vocabulary_split` read off a decoder: a built model (the trainer's) or the planner's meta skeleton."""
    return vocabulary_split(vocab_size=decoder.vocab_size, padded_vocab_size=decoder.embedding.num_embeddings,
                            tied=decoder.lm_head is None, tp=tp)


def plan_of(module: Any) -> ParallelPlan | None:
    """The module's declared plan, or None when it declares none."""
    declare = getattr(module, "parallel_plan", None)
    return dict(declare()) if callable(declare) else None


def local_share(value: Any) -> Any:
    """This process' share of a parameter its module's forward reads directly (attention sinks, one per head):
    the local part when tensor parallelism split it (a DTensor), else the value itself (None included)."""
    to_local = getattr(value, "to_local", None)
    return value if to_local is None else to_local()


def declared_splits(component: Any, plan: ParallelPlan | None = None) -> Iterator[tuple[str, Any, str, tuple[Split, ...]]]:
    """Each parameter of ``component`` with the module that speaks for it: ``(name, owner, name in the owner, splits)``.

    The owner is the outermost module whose plan names the parameter (the holder knows how
    a part is applied: attention names its per-head norm's weight), else the deepest module
    above it that declares a plan (which keeps it whole); ``plan``, when given, stands for
    the component's own. ``owner`` is None when no module above declares a plan, and the
    splits are then ``()``. The planner (``summary --parallel``) and the trainer's tensor
    parallelism both read a component's parameters through this one rule.
    """
    for name, owner, local, entries in _owned(component, plan):
        yield name, owner, local, tuple(e for e in entries if isinstance(e, Split))


def shared_weights(component: Any, axis: str) -> list[str]:
    """The parameters of ``component`` its plans declare :class:`Shared` over ``axis``: their gradients are summed."""
    return [name for name, _, _, entries in _owned(component, None)
            if any(isinstance(e, Shared) and e.axis == axis for e in entries)]


def _owned(component: Any, plan: ParallelPlan | None) -> Iterator[tuple[str, Any, str, tuple[Split | Shared, ...]]]:
    owners: list[tuple[str, Any, ParallelPlan]] = []  # (module prefix, module, its plan), outermost first
    if plan is not None:
        owners.append(("", component, plan))
    for prefix, module in component.named_modules():
        declared = plan_of(module)
        if declared is not None and not (prefix == "" and plan is not None):
            owners.append((prefix + "." if prefix else "", module, declared))
    for name, _ in component.named_parameters():
        above = [o for o in owners if name.startswith(o[0])]
        naming = [o for o in above if name[len(o[0]):] in o[2]]
        owner = naming[0] if naming else max(above, key=lambda o: len(o[0]), default=None)
        if owner is None:
            yield name, None, name, ()
            continue
        prefix, module, declared = owner
        yield name, module, name[len(prefix):], tuple(declared.get(name[len(prefix):], ()))


__all__ = ["ROW_ORDER", "ParallelPlan", "Shared", "Split", "VocabularySplit", "WEIGHT_AXES", "declared_splits",
           "local_share", "plan_of", "shared_weights", "vocabulary_of", "vocabulary_split"]
