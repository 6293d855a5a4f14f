"""What every block layout shares: its parts, their order, and how they are made.

A layout is a declaration over :class:`Block`: the names of its parts in the order
they are registered (which fixes the order of ``parameters()`` and of the state dict),
its residual connections, and a ``forward`` that wires them around the residual stream.
Every part other than ``attention`` and ``ffn`` is a norm, made by the ``make_norm()``
the builder passes (one call per norm, so each has its own weights).

Sublayer outputs join the stream through connections (:mod:`specformer.model.residual`),
made by the ``make_residual()`` the builder passes, one per entry of
:attr:`Block.residuals`: ``h, mix = conn.read(x)`` gives a sublayer its input and
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

SUBLAYERS = ("attention", "ffn")


class Block(nn.Module):
    """A transformer block: ``attention``, ``ffn`` and the norms its layout names in :attr:`parts`.

    A layout subclasses it with its ``parts``, its ``Params`` and its ``forward(x, ctx)``.
    """

    #: Every part, in registration order: ``attention``, ``ffn`` and the names of the norms.
    parts: ClassVar[tuple[str, ...]] = ()

    #: Each residual connection and the sublayers whose outputs it writes (one each, unless they share a write).
    residuals: ClassVar[dict[str, tuple[str, ...]]] = {"attention_residual": ("attention",), "ffn_residual": ("ffn",)}

    Params: ClassVar[type[BlockParams]] = BlockParams

    def __init__(self, params: BlockParams | None = None, *, attention: nn.Module, ffn: nn.Module,
                 make_norm: Callable[[], nn.Module],
                 make_residual: Callable[[], ResidualConnection] = ResidualConnection) -> None:
        super().__init__()
        params = params if params is not None else self.Params()
        made = self.norms_made(params)
        # Parts in registration order; a norm this layout does without (per its params) is None, and one
        # that serves only absent sublayers (``ffn: none``) is an Identity: no weights, the forward unchanged.
        given = {"attention": attention, "ffn": ffn}
        for name in self.parts:
            if name in SUBLAYERS:
                part = given[name]
            elif name not in made:
                part = None
            elif all(is_absent(given[s]) for s in self.norm_serves(name, params)):
                part = nn.Identity()
            else:
                part = make_norm()
            setattr(self, name, part)
        # A connection whose sublayers are all absent writes nothing: it passes the stream on, with no weights.
        for name, sublayers in self.residuals.items():
            setattr(self, name, Bypass() if all(is_absent(given[s]) for s in sublayers) else make_residual())
        self.ffn_reads_context = bool(getattr(ffn, "reads_context", False))

    def feed_forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        """``ffn(x)``, or ``ffn(x, ctx)`` for a feed-forward that reads the forward context (hash routing's token ids)."""
        return self.ffn(x, ctx) if self.ffn_reads_context else self.ffn(x)

    def norms_made(self, params: BlockParams) -> tuple[str, ...]:
        """The norms ``make_norm`` builds for these params (a layout whose norms depend on a param overrides it)."""
        return tuple(p for p in self.parts if p not in SUBLAYERS)

    def norm_serves(self, name: str, params: BlockParams) -> tuple[str, ...]:
        """The sublayers norm ``name`` serves: the one its name starts with (a layout sharing norms overrides it)."""
        return tuple(s for s in SUBLAYERS if name.startswith(f"{s}_"))


__all__ = ["Block"]
