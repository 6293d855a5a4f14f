"""The contract of the residual stream: what the embeddings become, how each sublayer reads and writes it.

A model's residual stream is a component of the ``residual`` kind
(``model.block.residual``; by default ``single``, the one stream every layout adds to).
It is built once per model and has two faces:

* the Decoder calls :meth:`ResidualStream.expand` on the embeddings before the first
  block and :meth:`ResidualStream.collapse` before the final norm (the stream may be
  wider than ``(B, T, d_model)`` in between: hyper-connections keep ``(B, T, N, d_model)``);
* a block layout calls ``make_residual()`` (the builder passes
  :meth:`ResidualStream.connection`) once per place where sublayer outputs join the
  stream, and wires each sublayer as ``h, mix = conn.read(x)``; ``out = sublayer(h)``;
  ``x = conn.write(x, out, mix)``. ``read`` gives the sublayer its ``(B, T, d_model)``
  input; ``write`` adds the output back. For one stream these are ``x`` and ``x + out``.

A connection's ``n_streams`` tells a layout what it holds: a layout that normalises the
stream itself (post-norm) can work on one stream only and refuses more while being built.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn


class ResidualConnection(nn.Module):
    """Where a block's sublayer output joins the stream: one stream, ``x`` read and ``x + out`` written."""

    #: How many parallel streams the connection reads and writes.
    n_streams: int = 1

    def read(self, stream: Tensor) -> tuple[Tensor, Any]:
        """The sublayer's input ``(B, T, d_model)``, and what :meth:`write` needs from this read."""
        return stream, None

    def write(self, stream: Tensor, *outputs: Tensor, mix: Any = None) -> Tensor:
        """The stream with the sublayer ``outputs`` (each ``(B, T, d_model)``) added, in the order given."""
        for out in outputs:
            stream = stream + out
        return stream


class ResidualStream(nn.Module):
    """A model's residual stream (the base is the plain single stream): expand, connections, collapse."""

    n_streams: int = 1

    def expand(self, x: Tensor) -> Tensor:
        """The stream the first block reads, made from the embeddings ``(B, T, d_model)``."""
        return x

    def collapse(self, stream: Tensor) -> Tensor:
        """What the final norm reads, ``(..., d_model)``, from the stream a block wrote."""
        return stream

    def connection(self) -> ResidualConnection:
        """A fresh connection for one place in one block (its own weights, if it has any)."""
        return ResidualConnection()

    def describe(self) -> str | None:
        """One line for ``summary`` (None: the default single stream, which needs no mention)."""
        return None


__all__ = ["ResidualConnection", "ResidualStream"]
