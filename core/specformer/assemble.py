"""Assembling: the modules of a resolved model, wired together.

Components receive sizes and sub-parts, never the spec. A ``ValueError`` or
``TypeError`` a component raises while being constructed is a problem with the spec
and is reported at the spec path of that component (which :mod:`specformer.validate`
recorded while resolving it).

Used twice over, on purpose and in different ways: the size check
(:mod:`specformer.sizes`) constructs the skeleton and one block per distinct layer on
the ``meta`` device, and :func:`specformer.build` constructs the whole model once.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch
from torch import nn

from specformer.decoder import Decoder
from specformer.errors import Problem, SpecError
from specformer.spec_shapes import ModelSpec
from specformer.validate import ResolvedModel, ResolvedPart


def assemble(resolved: ResolvedModel, *, device: torch.device | str | None = None) -> Decoder:
    """Construct the modules of a resolved model (weights as PyTorch initialises them)."""
    m = resolved.spec
    with torch.device(device) if device is not None else contextlib.nullcontext():
        blocks = [make_block(parts, m, index) for index, parts in enumerate(resolved.layers)]
        return make_decoder(resolved, blocks, first_attention=blocks[0].attention)


def make_block(parts: dict[str, ResolvedPart], m: ModelSpec, index: int) -> nn.Module:
    """One block (layout around attention, ffn and norms) for layer ``index``."""
    attention = _make(parts["attention"], d_model=m.d_model, layer_index=index, n_layers=m.n_layers)
    ffn = _make(parts["ffn"], d_model=m.d_model, layer_index=index, n_layers=m.n_layers)
    make_norm = _norm_maker(parts["norm"], dim=m.d_model)
    return _make(
        parts["layout"],
        d_model=m.d_model,
        attention=attention,
        ffn=ffn,
        make_norm=make_norm,
        layer_index=index,
        n_layers=m.n_layers,
    )


def check_same_heads(attentions: list[nn.Module]) -> None:
    """The positional scheme is shared by all layers and is sized once: heads must agree."""
    head_dims = {a.head_dim for a in attentions}
    n_heads = {a.n_heads for a in attentions}
    if len(head_dims) > 1 or len(n_heads) > 1:
        raise SpecError(
            [Problem("model.layers", f"every layer must have the same head_dim and n_heads; got head_dim {sorted(head_dims)}, n_heads {sorted(n_heads)}")]
        )


def make_decoder(resolved: ResolvedModel, blocks: list[nn.Module], *, first_attention: nn.Module) -> Decoder:
    """The Decoder around ``blocks`` (possibly none, for size estimates): embedding, positional, norm, head."""
    m = resolved.spec
    check_same_heads([b.attention for b in blocks] or [first_attention])
    multiplier = math.sqrt(m.d_model) if m.embedding_multiplier == "sqrt_d_model" else float(m.embedding_multiplier)
    positional = _make(
        resolved.positional,
        d_model=m.d_model,
        n_heads=first_attention.n_heads,
        head_dim=first_attention.head_dim,
        context_length=m.context_length,
    )
    final_norm = _make(resolved.final_norm, dim=m.d_model)
    try:
        return Decoder(
            vocab_size=m.vocab_size,
            padded_vocab_size=m.padded_vocab_size,
            d_model=m.d_model,
            context_length=m.context_length,
            positional=positional,
            blocks=blocks,
            final_norm=final_norm,
            tie_embeddings=m.tie_embeddings,
            lm_head_bias=m.lm_head_bias,
            embedding_multiplier=multiplier,
            logit_softcap=m.logit_softcap,
            embedding_dropout=m.embedding_dropout,
        )
    except (RuntimeError, OverflowError) as exc:
        raise SpecError([Problem("model", f"sizes too large for a tensor ({_first_line(exc)})")]) from None
    except TypeError as exc:
        if "Overflow" not in str(exc):
            raise
        # A size of 2**63 or more: torch cannot even unpack it ("Overflow when unpacking long long"; found by fuzzing).
        raise SpecError([Problem("model", f"sizes too large for a tensor ({_first_line(exc)})")]) from None


def _make(part: ResolvedPart, **sizes: Any) -> Any:
    try:
        return part.resolved.make(**sizes)
    except SpecError:
        raise  # a sub-part (a norm a layout makes) already reported at its own path
    except (ValueError, TypeError) as exc:
        if "Overflow" not in str(exc):
            raise SpecError([Problem(part.path, _first_line(exc))]) from None
        raise SpecError([Problem(part.path, f"sizes too large for a tensor ({_first_line(exc)})")]) from None
    except (RuntimeError, OverflowError) as exc:
        # torch refusing a size: "Storage size calculation overflowed", "Overflow when unpacking long".
        raise SpecError([Problem(part.path, f"sizes too large for a tensor ({_first_line(exc)})")]) from None


def _first_line(exc: BaseException) -> str:
    """torch appends C++ frames to some messages; a user needs the first line only."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0] if len(lines[0]) <= 300 else lines[0][:299] + "…"


def _norm_maker(part: ResolvedPart, *, dim: int) -> Callable[..., nn.Module]:
    """Layouts call this once per norm they place; ``dim`` can be overridden (e.g. for a sublayer)."""

    def make_norm(*, dim: int = dim) -> nn.Module:
        return _make(part, dim=dim)

    return make_norm


__all__ = ["assemble", "check_same_heads", "make_block", "make_decoder"]
