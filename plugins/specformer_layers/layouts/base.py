"""What every block layout shares: its parts, their order, and how they are made.

A layout is a declaration over :class:`Block`: the names of its parts in the order
they are registered (which fixes the order of ``parameters()`` and of the state dict),
and a ``forward`` that wires them around the residual stream. Every part other than
``attention`` and ``ffn`` is a norm, made by the ``make_norm()`` the builder passes
(one call per norm, so each has its own weights).
"""

from __future__ import annotations

from typing import Any, Callable, ClassVar

from torch import nn

from specformer.registry.params import Params

SUBLAYERS = ("attention", "ffn")


class Block(nn.Module):
    """A transformer block: ``attention``, ``ffn`` and the norms its layout names in :attr:`parts`.

    A layout subclasses it with its ``parts`` and its ``forward(x, ctx)``.
    """

    #: Every part, in registration order: ``attention``, ``ffn`` and the names of the norms.
    parts: ClassVar[tuple[str, ...]] = ()

    class Params(Params):
        pass

    def __init__(self, *, attention: nn.Module, ffn: nn.Module, **norms: nn.Module | None) -> None:
        super().__init__()
        expected = [p for p in self.parts if p not in SUBLAYERS]
        if sorted(norms) != sorted(expected):
            raise TypeError(f"{type(self).__name__} takes the norms {', '.join(expected)}; got {', '.join(sorted(norms))}")
        given = {"attention": attention, "ffn": ffn, **norms}
        for name in self.parts:
            setattr(self, name, given[name])

    @classmethod
    def norms_made(cls, params: Any) -> tuple[str, ...]:
        """The norms ``make_norm`` builds for these params (a layout whose norms depend on a param overrides it)."""
        return tuple(p for p in cls.parts if p not in SUBLAYERS)

    @classmethod
    def from_params(cls, params: Any, *, d_model: int, attention: nn.Module, ffn: nn.Module,
                    make_norm: Callable[[], nn.Module], layer_index: int, n_layers: int) -> "Block":
        made = cls.norms_made(params)
        norms = {name: make_norm() if name in made else None for name in cls.parts if name not in SUBLAYERS}
        return cls(attention=attention, ffn=ffn, **norms)


__all__ = ["Block"]
