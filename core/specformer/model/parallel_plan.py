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
from typing import Any, Literal, Mapping

#: The axes a weight may split over.
WEIGHT_AXES = ("tp", "ep")


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


#: A module's plan: parameter name -> its segments (``()``: replicated by choice).
ParallelPlan = Mapping[str, tuple[Split, ...]]


def plan_of(module: Any) -> ParallelPlan | None:
    """The module's declared plan, or None when it declares none."""
    declare = getattr(module, "parallel_plan", None)
    return dict(declare()) if callable(declare) else None


__all__ = ["ParallelPlan", "Split", "WEIGHT_AXES", "plan_of"]
