"""What every block layout shares: its parts, their order, and how they are made.

A layout is a declaration over :class:`Block`: the names of its parts in the order
they are registered (which fixes the order of ``parameters()`` and of the state dict),
and a ``forward`` that wires them around the residual stream. Every part other than
``attention`` and ``ffn`` is a norm, made by the ``make_norm()`` the builder passes
(one call per norm, so each has its own weights).
"""

from __future__ import annotations

from typing import Callable, ClassVar

from torch import nn

from specformer_layers.layouts.absent import is_absent
from specformer_layers.layouts.params import BlockParams


class Block(nn.Module):
    """A transformer block: ``attention``, ``ffn`` and the norms its layout's params name in ``parts``.

    A layout subclasses it with its ``Params`` (which name the parts and say which norms are
    made, :meth:`~specformer_layers.layouts.params.BlockParams.norm_plan`) and its ``forward(x, ctx)``.
    """

    Params: ClassVar[type[BlockParams]] = BlockParams

    def __init__(self, params: BlockParams | None = None, *, attention: nn.Module, ffn: nn.Module,
                 make_norm: Callable[[], nn.Module]) -> None:
        super().__init__()
        params = params if params is not None else self.Params()
        if not set(params.parts) >= {"attention", "ffn"}:
            raise TypeError(f"{type(self).__name__}: its params ({type(params).__name__}) must name the layout's parts, "
                            f"attention and ffn among them (parts: ClassVar[tuple[str, ...]] on the BlockParams subclass)")
        given = {"attention": attention, "ffn": ffn}
        plan = params.norm_plan(absent={name: is_absent(module) for name, module in given.items()})
        # Parts in registration order; a norm this layout does without (per its params) is None, and one
        # that serves only absent sublayers (``ffn: none``) is an Identity: no weights, the forward unchanged.
        for name in params.parts:
            if name in given:
                part = given[name]
            elif plan[name] == "norm":
                part = make_norm()
            else:
                part = nn.Identity() if plan[name] == "identity" else None
            setattr(self, name, part)


__all__ = ["Block"]
