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

from specformer.model.attention import cache_slots_of, kv_source_of, positional_dim_of
from specformer.model.state import uses_positions
from specformer.model.decoder import Decoder
from specformer.errors import Problem, SpecError
from specformer.model.positional import PositionalScheme, adds_to_embeddings
from specformer.model.residual import ResidualConnection, ResidualStream
from specformer.spec.shapes import ModelSpec
from specformer.spec.layer_groups import overrides_of_layer
from specformer.spec.validate import ResolvedModel, ResolvedPart


def assemble(resolved: ResolvedModel, *, device: torch.device | str | None = None) -> Decoder:
    """Construct the modules of a resolved model (weights as PyTorch initialises them)."""
    m = resolved.spec
    with torch.device(device) if device is not None else contextlib.nullcontext():
        residual = make_residual_stream(resolved)
        per_layer_input = make_per_layer_input(resolved)
        width = per_layer_width(per_layer_input)
        blocks = [make_block(parts, m, index, residual=residual, per_layer_input=width)
                  for index, parts in enumerate(resolved.layers)]
        return make_decoder(resolved, blocks, first_attention=positional_mixer(blocks), residual=residual,
                            per_layer_input=per_layer_input)


def make_residual_stream(resolved: ResolvedModel) -> ResidualStream:
    """The model's residual stream (``model.block.residual``): built once, its connections made by each block."""
    m = resolved.spec
    return _make(resolved.residual, d_model=m.d_model)


def positional_mixer(blocks: list[nn.Module]) -> nn.Module:
    """The mixer that sizes the model-level positional scheme: the first that reads positions (else the first)."""
    return next((b.attention for b in blocks if uses_positions(b.attention)), blocks[0].attention)


def make_per_layer_input(resolved: ResolvedModel) -> nn.Module | None:
    """``model.per_layer_input`` built (the per-layer inputs of every block), or None when the model has none."""
    part, m = resolved.per_layer_input, resolved.spec
    return None if part is None else _make(part, vocab_size=m.vocab_size, d_model=m.d_model, n_layers=m.n_layers)


def per_layer_width(per_layer_input: nn.Module | None) -> int:
    """Channels of the per-layer input each block receives (the part's ``width``); 0 without one."""
    return 0 if per_layer_input is None else int(per_layer_input.width)


def make_block(parts: dict[str, ResolvedPart], m: ModelSpec, index: int, *, residual: ResidualStream,
               per_layer_input: int = 0) -> nn.Module:
    """One block (layout around attention, ffn and norms, joined to ``residual``) for layer ``index``.

    ``per_layer_input``: the width of the per-layer input the block receives (0: none); a
    layout that takes one names that size and declares ``per_layer_width``, so a model
    whose layout would ignore its per-layer inputs is refused here.
    """
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
        per_layer_input=per_layer_input,
    )
    if residual.n_streams != 1 and not connections:
        # A layout that never asks for a connection adds its outputs to the stream itself: one stream only.
        name = parts["layout"].resolved.component.name
        raise SpecError([Problem(parts["layout"].path, f"layout {name!r} takes no make_residual, so it adds to a single "
                                                       f"residual stream; it cannot run with the {residual.n_streams} "
                                                       f"streams of model.block.residual (use residual: single)")])
    if per_layer_input and getattr(block, "per_layer_width", 0) != per_layer_input:
        name = parts["layout"].resolved.component.name
        raise SpecError([Problem(parts["layout"].path, f"model.per_layer_input gives every block a per-layer input, and "
                                                       f"the {name!r} layout takes none; use a layout that does (sandwich)")])
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


def check_kv_sharing(resolved: ResolvedModel, blocks: list[nn.Module]) -> None:
    """Size check of cross-layer KV sharing: every ``kv_from`` names a layer that keeps keys and values this layer can read.

    ``blocks`` holds one block per group of ``resolved.groups`` (the layer a group's first
    layer reads may belong to any group). That the source comes earlier is the attention's
    own check; here: the source keeps keys and values of its own (not a recurrent mixer, not
    a layer that itself reads another's), of the same heads and width, and sees at least as
    far back (a cache keeps only the source's window).
    """
    group_of = {g.group.overrides: block for g, block in zip(resolved.groups, blocks)}
    problems = []
    for g, block in zip(resolved.groups, blocks):
        reader = block.attention
        source_index = kv_source_of(reader)
        if source_index is None:
            continue
        path = f"{g.parts['attention'].path}.kv_from"
        source = group_of[overrides_of_layer(source_index, resolved.selections)].attention
        name = type(source).__name__
        slots = cache_slots_of(source)
        if kv_source_of(source) is not None:
            problems.append(Problem(path, f"layer {source_index} itself reads layer {kv_source_of(source)}'s keys and values; "
                                          f"name that layer ({kv_source_of(source)}) instead"))
        elif slots is None:
            problems.append(Problem(path, f"layer {source_index} ({name}) keeps no keys and values to share; kv_from must "
                                          f"name an earlier attention layer"))
        elif (slots.key_heads, slots.key_dim, slots.value_heads, slots.value_dim) != (
                reader.n_kv_heads, reader.head_dim, reader.n_kv_heads, reader.head_dim):
            problems.append(Problem(path, f"layer {source_index} keeps keys of {slots.key_heads} heads x {slots.key_dim} and "
                                          f"values of {slots.value_heads} heads x {slots.value_dim}, this layer reads "
                                          f"{reader.n_kv_heads} heads x {reader.head_dim}; give both the same n_kv_heads "
                                          f"and head_dim"))
        elif source.window is not None and (reader.window is None or reader.window > source.window):
            problems.append(Problem(path, f"layer {source_index} keeps only its last {source.window} tokens (its window), "
                                          f"this layer reads {'every earlier token' if reader.window is None else f'the last {reader.window}'}; "
                                          f"read a layer whose window is no shorter"))
    if problems:
        raise SpecError(problems)


def make_decoder(resolved: ResolvedModel, blocks: list[nn.Module], *, first_attention: nn.Module,
                 residual: ResidualStream | None = None, per_layer_input: nn.Module | None = None) -> Decoder:
    """The Decoder around ``blocks`` (possibly none, for size estimates): embedding, positional, residual stream,
    norm, head, and the per-layer input part the blocks were made for. ``residual`` is the stream the blocks were
    joined to (made here when not given); ``per_layer_input`` is built once by the caller."""
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
            per_layer_input=per_layer_input,
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


__all__ = ["assemble", "check_kv_sharing", "check_layer_positionals", "layer_positionals", "make_block", "make_decoder",
           "make_layer_positional", "make_per_layer_input", "make_residual_stream", "per_layer_width", "positional_mixer"]
