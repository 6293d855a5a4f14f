"""Assembling: the modules of a resolved model, wired together.

Components receive sizes and sub-parts, never the spec. A ``ValueError`` or
``TypeError`` a component raises while being constructed is a problem with the spec
and is reported at the spec path of that component (which :mod:`specformer.spec.validate`
recorded while resolving it).

Used twice over, on purpose and in different ways: the size check
(:mod:`specformer.model.sizes`) constructs the skeleton and one block per distinct layer on
the ``meta`` device, and :func:`specformer.build` constructs the whole model once.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any, Callable

import torch
from torch import nn

from specformer.model.attention import positional_dim_of
from specformer.model.state import uses_positions
from specformer.model.decoder import Decoder
from specformer.errors import Problem, SpecError
from specformer.model.positional import PositionalScheme, adds_to_embeddings
from specformer.model.residual import ResidualConnection, ResidualStream
from specformer.spec.shapes import ModelSpec
from specformer.spec.validate import ResolvedModel, ResolvedPart


def assemble(resolved: ResolvedModel, *, device: torch.device | str | None = None) -> Decoder:
    """Construct the modules of a resolved model (weights as PyTorch initialises them)."""
    m = resolved.spec
    with torch.device(device) if device is not None else contextlib.nullcontext():
        residual = make_residual_stream(resolved)
        blocks = [make_block(parts, m, index, residual=residual) for index, parts in enumerate(resolved.layers)]
        return make_decoder(resolved, blocks, first_attention=positional_mixer(blocks), residual=residual)


def make_residual_stream(resolved: ResolvedModel) -> ResidualStream:
    """The model's residual stream (``model.block.residual``): built once, its connections made by each block."""
    m = resolved.spec
    return _make(resolved.residual, d_model=m.d_model)


def positional_mixer(blocks: list[nn.Module]) -> nn.Module:
    """The mixer that sizes the model-level positional scheme: the first that reads positions (else the first)."""
    return next((b.attention for b in blocks if uses_positions(b.attention)), blocks[0].attention)


def make_block(parts: dict[str, ResolvedPart], m: ModelSpec, index: int, *, residual: ResidualStream) -> nn.Module:
    """One block (layout around attention, ffn and norms, joined to ``residual``) for layer ``index``."""
    attention = _make(parts["attention"], d_model=m.d_model, layer_index=index, n_layers=m.n_layers,
                      context_length=m.context_length)
    ffn = _make(parts["ffn"], d_model=m.d_model, layer_index=index, n_layers=m.n_layers, vocab_size=m.vocab_size)
    make_norm = _norm_maker(parts["norm"], dim=m.d_model)
    connections: list[nn.Module] = []

    def make_residual() -> ResidualConnection:
        connections.append(residual.connection())
        return connections[-1]

    block = _make(
        parts["layout"],
        d_model=m.d_model,
        attention=attention,
        ffn=ffn,
        make_norm=make_norm,
        make_residual=make_residual,
        layer_index=index,
        n_layers=m.n_layers,
    )
    if residual.n_streams != 1 and not connections:
        # A layout that never asks for a connection adds its outputs to the stream itself: one stream only.
        name = parts["layout"].resolved.component.name
        raise SpecError([Problem(parts["layout"].path, f"layout {name!r} takes no make_residual, so it adds to a single "
                                                       f"residual stream; it cannot run with the {residual.n_streams} "
                                                       f"streams of model.block.residual (use residual: single)")])
    return block


def make_layer_positional(part: ResolvedPart, attention: nn.Module, m: ModelSpec) -> PositionalScheme:
    """The positional scheme inside one layer's attention, sized by its heads; SpecError for an embedding scheme.

    A scheme that adds to the token embeddings (learned, sinusoidal) is model-level: on a
    layer it could only be ignored, so it is refused at the path it was written at.
    """
    scheme = _make(part, d_model=m.d_model, n_heads=attention.n_heads, head_dim=positional_dim_of(attention),
                   context_length=m.context_length)
    if part.path != "model.positional" and adds_to_embeddings(scheme):
        name = part.resolved.component.name
        raise SpecError([Problem(part.path, f"{name!r} adds to the token embeddings, so it belongs in model.positional only; "
                                            "a layer takes a scheme that acts inside attention (such as rope, alibi or none)")])
    return scheme


def layer_positionals(resolved: ResolvedModel, blocks: list[nn.Module], model_scheme: PositionalScheme,
                      first_attention: nn.Module) -> tuple[list[PositionalScheme], list[int] | None]:
    """The distinct schemes the layers use beyond ``model_scheme``, and each layer's index into ``[model_scheme, *those]``.

    Layers whose scheme has the same params and is sized by the same heads share one module
    (so its tables are prepared once per forward). None for the index when every layer
    uses ``model_scheme``.
    """
    m = resolved.spec

    refs: dict[int, str] = {}  # one JSON form per resolved part (shared by the layers of a group)

    def key(part: ResolvedPart, attention: nn.Module) -> tuple[str, int, int]:
        if id(part) not in refs:
            refs[id(part)] = json.dumps(part.resolved.to_dict(), sort_keys=True)
        return refs[id(part)], int(attention.n_heads), positional_dim_of(attention)

    found = {key(resolved.positional, first_attention): 0}
    schemes: list[PositionalScheme] = []
    chosen: list[int] = []
    for parts, block in zip(resolved.layers, blocks):
        part = parts.get("positional", resolved.positional)
        if not uses_positions(block.attention):
            if part is not resolved.positional:
                name = type(block.attention).__name__
                raise SpecError([Problem(part.path, f"this layer's mixer ({name}) reads no positions, so a positional "
                                                    f"scheme on it would do nothing; leave positional out of this layer")])
            chosen.append(0)  # a recurrence is ordered by itself: the scheme is never called
            continue
        if part is resolved.positional and adds_to_embeddings(model_scheme):
            chosen.append(0)  # an embedding scheme does nothing inside attention, whatever the heads
            continue
        k = key(part, block.attention)
        if k not in found:
            schemes.append(make_layer_positional(part, block.attention, m))
            found[k] = len(schemes)
        chosen.append(found[k])
    return schemes, (chosen if any(chosen) else None)


def check_layer_positionals(resolved: ResolvedModel, blocks: list[tuple[nn.Module, ResolvedPart | None]]) -> None:
    """Size check: every per-layer scheme can be built for its layer's heads and acts inside attention."""
    for block, part in blocks:
        if part is not None and part is not resolved.positional:
            if not uses_positions(block.attention):
                raise SpecError([Problem(part.path, f"this layer's mixer ({type(block.attention).__name__}) reads no "
                                                    f"positions, so a positional scheme on it would do nothing; leave "
                                                    f"positional out of this layer")])
            make_layer_positional(part, block.attention, resolved.spec)


def make_decoder(resolved: ResolvedModel, blocks: list[nn.Module], *, first_attention: nn.Module,
                 residual: ResidualStream | None = None) -> Decoder:
    """The Decoder around ``blocks`` (possibly none, for size estimates): embedding, positional, residual stream,
    norm, head. ``residual`` is the stream the blocks were joined to (made here when not given)."""
    m = resolved.spec
    residual = residual if residual is not None else make_residual_stream(resolved)
    multiplier = math.sqrt(m.d_model) if m.embedding_multiplier == "sqrt_d_model" else float(m.embedding_multiplier)
    positional = _make(
        resolved.positional,
        d_model=m.d_model,
        n_heads=first_attention.n_heads,
        head_dim=positional_dim_of(first_attention),
        context_length=m.context_length,
    )
    extra, chosen = layer_positionals(resolved, blocks, positional, first_attention) if blocks else ([], None)
    final_norm = _make(resolved.final_norm, dim=m.d_model)
    try:
        return Decoder(
            vocab_size=m.vocab_size,
            padded_vocab_size=m.padded_vocab_size,
            d_model=m.d_model,
            context_length=m.context_length,
            positional=positional,
            layer_positionals=extra,
            layer_scheme=chosen,
            blocks=blocks,
            final_norm=final_norm,
            residual=residual,
            tie_embeddings=m.tie_embeddings,
            lm_head_bias=m.lm_head_bias,
            embedding_multiplier=multiplier,
            logit_softcap=m.logit_softcap,
            logit_scale=m.logit_scale,
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


__all__ = ["assemble", "check_layer_positionals", "layer_positionals", "make_block", "make_decoder",
           "make_layer_positional", "make_residual_stream", "positional_mixer"]
