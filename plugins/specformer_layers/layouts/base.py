"""What every block layout shares: its parts, their order, and how they are made.

A layout is a declaration over :class:`Block`: its params name its parts in the order
they are registered (which fixes the order of ``parameters()`` and of the state dict)
and its residual connections (:class:`~specformer_layers.layouts.params.BlockParams`), and
its ``forward`` wires them around the residual stream.
Every part other than ``mixer`` and ``ffn`` is a norm, made by the ``make_norm()``
the builder passes (one call per norm, so each has its own weights).

Sublayer outputs join the stream through connections (:mod:`specformer.model.residual`),
made by the ``make_residual()`` the builder passes, one per entry of
:attr:`BlockParams.residuals`: ``h, mix = conn.read(x)`` gives a sublayer its input and
``conn.write(x, out, mix=mix)`` adds its output, whatever the model's residual kind
(one stream, or hyper-connections' several). They are registered after the parts, so
a single stream (no weights) leaves the state dict as it was.
"""

from __future__ import annotations

from typing import Callable, ClassVar

from torch import Tensor, nn

from specformer.model.context import ForwardContext

from specformer.model.residual import ResidualConnection
from specformer_layers.layouts.absent import Bypass, is_absent
from specformer_layers.layouts.params import BlockParams


class Block(nn.Module):
    """A transformer block: ``mixer``, ``ffn`` and the norms its layout's params name in ``parts``.

    A layout subclasses it with its ``Params`` (which name the parts and say which norms are
    made, :meth:`~specformer_layers.layouts.params.BlockParams.norm_plan`) and its ``forward(x, ctx)``.
    """

    Params: ClassVar[type[BlockParams]] = BlockParams

    def __init__(self, params: BlockParams | None = None, *, mixer: nn.Module, ffn: nn.Module,
                 make_norm: Callable[[], nn.Module],
                 make_residual: Callable[[], ResidualConnection] = ResidualConnection) -> None:
        super().__init__()
        params = params if params is not None else self.Params()
        if not set(params.parts) >= {"mixer", "ffn"}:
            raise TypeError(f"{type(self).__name__}: its params ({type(params).__name__}) must name the layout's parts, "
                            f"mixer and ffn among them (parts: ClassVar[tuple[str, ...]] on the BlockParams subclass)")
        given = {"mixer": mixer, "ffn": ffn}
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
        # A connection whose sublayers are all absent writes nothing: it passes the stream on, with no weights.
        for name, sublayers in params.residuals.items():
            setattr(self, name, Bypass() if all(is_absent(given[s]) for s in sublayers) else make_residual())
        self.ffn_reads_context = bool(getattr(ffn, "reads_context", False))

    def feed_forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        """``ffn(x)``, or ``ffn(x, ctx)`` for a feed-forward that reads the forward context (hash routing's token ids)."""
        return self.ffn(x, ctx) if self.ffn_reads_context else self.ffn(x)


__all__ = ["Block"]
