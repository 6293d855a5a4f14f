"""Which sizes each part of a resolved model receives: the builder's size flow, written once.

A component receives its sizes and sub-parts, never the spec. Some sizes come from
other parts: a layout receives its mixer, ffn, a ``make_norm`` and a ``make_residual``
(a connection to the model's residual stream, made once before the blocks); a positional scheme
is sized by the heads of the mixer it serves (its ``n_heads`` and its positional width,
:func:`~specformer.model.attention.positional_dim_of`); a layer that reads no positions
takes no scheme; a block receives the width of the model's per-layer input (made once,
before the blocks). This module is that flow, over a :class:`Maker` that turns a resolved
part and its sizes into something with those facts:

- the builder's maker (:mod:`specformer.model.assemble`) constructs modules;
- the size check's maker (:mod:`specformer.spec.sizes`) asks each component's declared
  check (:class:`~specformer.model.sized.Sized`), so validating a spec needs no torch.

A ``ValueError`` or ``TypeError`` a part raises is a problem with the spec, reported at the
spec path of that part (which :mod:`specformer.spec.validate` recorded while resolving it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Protocol

from specformer.errors import Problem, SpecError
from specformer.messages import join_path
from specformer.model.attention import cache_slots_of, heads_of, kv_source_of, positional_dim_of
from specformer.model.sized import Sized, total
from specformer.model.state import uses_positions
from specformer.spec.layer_groups import overrides_of_layer
from specformer.spec.shapes import ModelSpec
from specformer.spec.validate import ResolvedModel, ResolvedPart


class Maker(Protocol):
    """Turns a resolved part and its sizes into a module (building) or its :class:`Sized` facts (checking)."""

    def make(self, part: ResolvedPart, **sizes: Any) -> Any: ...

    def adds_to_embeddings(self, scheme: Any) -> bool: ...

    def name(self, made: Any) -> str: ...

    def connection(self, stream: Any) -> Any:
        """A fresh connection of the residual ``stream`` for one place in one block."""
        ...


@dataclass
class Block:
    """One layer's block as made, and the mixer inside it (the positional scheme is sized by it)."""

    block: Any
    mixer: Any


@dataclass
class Skeleton:
    """The model's parts outside the blocks, as made."""

    residual: Any  # the residual stream the blocks were joined to
    per_layer_input: Any  # model.per_layer_input as made (the blocks were made for its width), or None
    positional: Any
    layer_positionals: list[Any]  # the distinct per-layer schemes beyond ``positional``
    layer_scheme: list[int] | None  # each layer's index into [positional, *layer_positionals]; None: all 0
    final_norm: Any
    embedding_norm: Any = None  # model.embedding_norm as made, or None when the model has none
    mtp: list["MTPParts"] = field(default_factory=list)  # model.mtp's depths as made, in order (none without mtp)
    shared_blocks: dict[str, Any] = field(default_factory=dict)  # model.shared_blocks as made, by name


@dataclass
class MTPParts:
    """One multi-token prediction depth's parts as made (:class:`specformer.model.mtp.MTPDepth` joins them)."""

    embedding_norm: Any  # enorm
    hidden_norm: Any  # hnorm
    block: Block
    final_norm: Any  # before the shared head
    positional: Any = None  # the scheme inside the depth's mixer when not the model's (model.mtp.block.positional)


def make_part(maker: Maker, part: ResolvedPart, **sizes: Any) -> Any:
    """``maker.make(part, **sizes)``; a ValueError/TypeError becomes a SpecError at the part's spec path."""
    try:
        return maker.make(part, **sizes)
    except SpecError:
        raise  # a sub-part (a norm a layout makes) already reported at its own path
    except (ValueError, TypeError) as exc:
        if "Overflow" not in str(exc):
            raise SpecError([Problem(part.path, first_line(exc))]) from None
        raise SpecError([Problem(part.path, f"sizes too large for a tensor ({first_line(exc)})")]) from None
    except (RuntimeError, OverflowError) as exc:
        # torch refusing a size: "Storage size calculation overflowed", "Overflow when unpacking long".
        raise SpecError([Problem(part.path, f"sizes too large for a tensor ({first_line(exc)})")]) from None


def first_line(exc: BaseException) -> str:
    """torch appends C++ frames to some messages; a user needs the first line only."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0] if len(lines[0]) <= 300 else lines[0][:299] + "…"


def make_residual_stream(maker: Maker, resolved: ResolvedModel) -> Any:
    """The model's residual stream (``model.block.residual``): made once, its connections made by each block."""
    return make_part(maker, resolved.residual, d_model=resolved.spec.d_model)


def make_per_layer_input(maker: Maker, resolved: ResolvedModel) -> Any:
    """``model.per_layer_input`` made (the per-layer inputs of every block), or None when the model has none."""
    part, m = resolved.per_layer_input, resolved.spec
    return None if part is None else make_part(maker, part, vocab_size=m.vocab_size, d_model=m.d_model,
                                               n_layers=m.n_layers)


def per_layer_width(per_layer_input: Any) -> int:
    """Channels of the per-layer input each block receives (the part's ``width``); 0 without one."""
    return 0 if per_layer_input is None else int(per_layer_input.width)


def make_block(maker: Maker, parts: dict[str, ResolvedPart], m: ModelSpec, index: int, *, residual: Any,
               per_layer_input: int = 0) -> Block:
    """One block (layout around mixer, ffn and norms, joined to ``residual``) for layer ``index``.

    ``per_layer_input``: the width of the per-layer input the block receives (0: none); a
    layout that takes one names that size and declares ``per_layer_width``, so a model
    whose layout would ignore its per-layer inputs is refused here.
    """
    mixer = make_part(maker, parts["mixer"], d_model=m.d_model, layer_index=index, n_layers=m.n_layers,
                      context_length=m.context_length)
    ffn = make_part(maker, parts["ffn"], d_model=m.d_model, layer_index=index, n_layers=m.n_layers,
                    vocab_size=m.vocab_size)
    connections: list[Any] = []

    def make_residual() -> Any:
        connections.append(maker.connection(residual))
        return connections[-1]

    block = make_part(
        maker,
        parts["layout"],
        d_model=m.d_model,
        mixer=mixer,
        ffn=ffn,
        make_norm=_norm_maker(maker, parts["norm"], dim=m.d_model),
        make_residual=make_residual,
        layer_index=index,
        n_layers=m.n_layers,
        per_layer_input=per_layer_input,
    )
    name = parts["layout"].resolved.component.name
    if residual.n_streams != 1 and not connections:
        # A layout that never asks for a connection adds its outputs to the stream itself: one stream only.
        raise SpecError([Problem(parts["layout"].path, f"layout {name!r} takes no make_residual, so it adds to a single "
                                                       f"residual stream; it cannot run with the {residual.n_streams} "
                                                       f"streams of model.block.residual (use residual: single)")])
    if per_layer_input and (getattr(block, "per_layer_width", 0) or 0) != per_layer_input:
        raise SpecError([Problem(parts["layout"].path, f"model.per_layer_input gives every block a per-layer input, and "
                                                       f"the {name!r} layout takes none; use a layout that does (sandwich)")])
    return Block(block, mixer)


def make_shared_blocks(maker: Maker, resolved: ResolvedModel, *, residual: Any) -> dict[str, Block]:
    """``model.shared_blocks`` made once each, sized as a block of the first layer that runs it.

    A shared block joins the model's single residual stream and keeps its own keys and values
    (a cache per use, :mod:`specformer.model.shared`): reading another layer's (``kv_from``) and
    several residual streams are refused at its path.
    """
    if not resolved.shared_blocks:
        return {}
    m, uses = resolved.spec, resolved.shared_uses
    made = {}
    for name, parts in resolved.shared_blocks.items():
        path = join_path("model", ["shared_blocks", name])
        if residual.n_streams != 1:
            raise SpecError([Problem(path, f"a shared block runs on a single residual stream; model.block.residual has "
                                           f"{residual.n_streams} (use residual: single)")])
        block = make_block(maker, parts, m, uses.index(name), residual=residual)
        if kv_source_of(block.mixer) is not None:
            raise SpecError([Problem(f"{parts['mixer'].path}.kv_from", "a shared block keeps its own keys and values "
                                                                       "at every use; leave kv_from out of it")])
        if m.shared_blocks[name].input == "concat_embeddings":
            block = _with_input_norm(block, make_part(maker, parts["norm"], dim=2 * m.d_model), path=path)
        made[name] = block
    return made


def _with_input_norm(made: Block, norm: Any, *, path: str) -> Block:
    """A shared block that reads concat(stream, embeddings), with its 2 x d_model norm (``input_norm``): the module
    holds it (``shared_blocks.<name>.input_norm.*``), a size check's facts count it. The block's own layout must
    leave the mixer's input unnormed and keep no residual of it (its input is twice the stream's width)."""
    block = made.block
    if isinstance(block, Sized):  # the torch-free size check's facts
        return replace(made, block=replace(block, parameters=total(block.parameters, norm.parameters)))
    if getattr(block, "attention_norm", None) is not None or getattr(block, "residual_scales", (1.0,))[0] != 0.0:
        raise SpecError([Problem(f"{path}.layout", "input concat_embeddings normalises the 2 x d_model input itself "
                                                   "(input_norm), and the stream it is concatenated from is no residual "
                                                   "of the mixer: use layout {kind: prenorm, mixer_pre_norm: false, "
                                                   "residual_scales: [0.0, 0.0]}")])
    block.input_norm = norm
    return made


def check_kv_sharing(maker: Maker, resolved: ResolvedModel, attentions: list[Any]) -> None:
    """Size check of cross-layer KV sharing: every ``kv_from`` names a layer that keeps keys and values this layer can read.

    ``attentions`` holds one mixer per group of ``resolved.groups`` (the layer a group's first
    layer reads may belong to any group). That the source comes earlier is the attention's
    own check; here: the source keeps keys and values of its own (not a recurrent mixer, not
    a layer that itself reads another's), of the same heads and width, and sees at least as
    far back (a cache keeps only the source's window).
    """
    group_of = {g.group.overrides: attention for g, attention in zip(resolved.groups, attentions)}
    problems = []
    for g, reader in zip(resolved.groups, attentions):
        source_index = kv_source_of(reader)
        if source_index is None:
            continue
        path = f"{g.parts['mixer'].path}.kv_from"
        source = group_of[overrides_of_layer(source_index, resolved.selections)]
        slots = cache_slots_of(source)
        further = kv_source_of(source)
        if further is not None:
            problems.append(Problem(path, f"layer {source_index} itself reads layer {further}'s keys and values; "
                                          f"name that layer ({further}) instead"))
        elif slots is None:
            problems.append(Problem(path, f"layer {source_index} ({maker.name(source)}) keeps no keys and values to "
                                          f"share; kv_from must name an earlier attention layer"))
        elif (slots.key_heads, slots.key_dim, slots.value_heads, slots.value_dim) != (
                reader.n_kv_heads, reader.head_dim, reader.n_kv_heads, reader.head_dim):
            problems.append(Problem(path, f"layer {source_index} keeps keys of {slots.key_heads} heads x {slots.key_dim} and "
                                          f"values of {slots.value_heads} heads x {slots.value_dim}, this layer reads "
                                          f"{reader.n_kv_heads} heads x {reader.head_dim}; give both the same n_kv_heads "
                                          f"and head_dim"))
        elif source.window is not None and (reader.window is None or reader.window > source.window):
            reads = "every earlier token" if reader.window is None else f"the last {reader.window}"
            problems.append(Problem(path, f"layer {source_index} keeps only its last {source.window} tokens (its window), "
                                          f"this layer reads {reads}; read a layer whose window is no shorter"))
    if problems:
        raise SpecError(problems)


def _norm_maker(maker: Maker, part: ResolvedPart, *, dim: int) -> Callable[..., Any]:
    """Layouts call this once per norm they place; ``dim`` can be overridden (e.g. for a sublayer)."""

    def make_norm(*, dim: int = dim) -> Any:
        return make_part(maker, part, dim=dim)

    return make_norm


def positional_mixer(attentions: list[Any]) -> Any:
    """The mixer that sizes the model-level positional scheme: the first that reads positions (else the first)."""
    return next((a for a in attentions if uses_positions(a)), attentions[0])


def positional_sizes(mixer: Any, *, d_model: int) -> tuple[int, int]:
    """``(n_heads, head_dim)`` a positional scheme serving ``mixer`` is sized by: its heads and positional width.

    A mixer with no heads (a short convolution, a per-channel recurrence) reads no positions, so a
    scheme sized by it is never called; it gets one head over the model width, which every scheme accepts.
    """
    if heads_of(mixer) is None:
        return 1, d_model
    return int(mixer.n_heads), positional_dim_of(mixer)


def make_layer_positional(maker: Maker, part: ResolvedPart, attention: Any, m: ModelSpec) -> Any:
    """The positional scheme inside one layer's attention, sized by its heads; SpecError for an embedding scheme.

    A scheme that adds to the token embeddings (learned, sinusoidal) is model-level: on a
    layer it could only be ignored, so it is refused at the path it was written at.
    """
    n_heads, head_dim = positional_sizes(attention, d_model=m.d_model)
    scheme = make_part(maker, part, d_model=m.d_model, n_heads=n_heads, head_dim=head_dim, context_length=m.context_length)
    if part.path != "model.positional" and maker.adds_to_embeddings(scheme):
        name = part.resolved.component.name
        raise SpecError([Problem(part.path, f"{name!r} adds to the token embeddings, so it belongs in model.positional only; "
                                            "a layer takes a scheme that acts inside attention (such as rope, alibi or none)")])
    return scheme


def _no_positions(maker: Maker, part: ResolvedPart, attention: Any) -> SpecError:
    return SpecError([Problem(part.path, f"this layer's mixer ({maker.name(attention)}) reads no positions, so a "
                                         f"positional scheme on it would do nothing; leave positional out of this layer")])


def layer_positionals(maker: Maker, resolved: ResolvedModel, attentions: list[Any], model_scheme: Any,
                      first_attention: Any) -> tuple[list[Any], list[int] | None]:
    """The distinct schemes the layers use beyond ``model_scheme``, and each layer's index into ``[model_scheme, *those]``.

    Layers whose scheme has the same params and is sized by the same heads share one module
    (so its tables are prepared once per forward). None for the index when every layer
    uses ``model_scheme``.
    """
    refs: dict[int, str] = {}  # one JSON form per resolved part (shared by the layers of a group)

    def key(part: ResolvedPart, attention: Any) -> tuple[str, int, int]:
        if id(part) not in refs:
            refs[id(part)] = json.dumps(part.resolved.to_dict(), sort_keys=True)
        return (refs[id(part)], *positional_sizes(attention, d_model=resolved.spec.d_model))

    found = {key(resolved.positional, first_attention): 0}
    schemes: list[Any] = []
    chosen: list[int] = []
    for parts, attention in zip(resolved.layers, attentions):
        part = parts.get("positional", resolved.positional)
        if not uses_positions(attention):
            if part is not resolved.positional:
                raise _no_positions(maker, part, attention)
            chosen.append(0)  # a recurrence is ordered by itself: the scheme is never called
            continue
        if part is resolved.positional and maker.adds_to_embeddings(model_scheme):
            chosen.append(0)  # an embedding scheme does nothing inside attention, whatever the heads
            continue
        k = key(part, attention)
        if k not in found:
            schemes.append(make_layer_positional(maker, part, attention, resolved.spec))
            found[k] = len(schemes)
        chosen.append(found[k])
    return schemes, (chosen if any(chosen) else None)


def check_layer_positionals(maker: Maker, resolved: ResolvedModel, blocks: list[tuple[Any, ResolvedPart | None]]) -> None:
    """Size check: every per-layer scheme can be made for its layer's heads and acts inside attention."""
    for attention, part in blocks:
        if part is not None and part is not resolved.positional:
            if not uses_positions(attention):
                raise _no_positions(maker, part, attention)
            make_layer_positional(maker, part, attention, resolved.spec)


def make_skeleton(maker: Maker, resolved: ResolvedModel, attentions: list[Any], *, first_attention: Any,
                  residual: Any, per_layer_input: Any, shared_blocks: dict[str, Block] | None = None) -> Skeleton:
    """The parts outside the blocks around ``residual`` (the stream the blocks were joined to) and
    ``per_layer_input`` (made once, before the blocks); per-layer schemes only when ``attentions``
    (every layer's) are given."""
    m = resolved.spec
    n_heads, head_dim = positional_sizes(first_attention, d_model=m.d_model)
    positional = make_part(maker, resolved.positional, d_model=m.d_model, n_heads=n_heads, head_dim=head_dim,
                           context_length=m.context_length)
    extra, chosen = layer_positionals(maker, resolved, attentions, positional, first_attention) if attentions else ([], None)
    final_norm = make_part(maker, resolved.final_norm, dim=m.d_model)
    embedding_norm = (make_part(maker, resolved.embedding_norm, dim=m.d_model)
                      if resolved.embedding_norm is not None else None)
    mtp = make_mtp(maker, resolved, residual=residual, positional=positional, first_attention=first_attention)
    return Skeleton(residual, per_layer_input, positional, extra, chosen, final_norm, embedding_norm, mtp,
                    {name: b.block for name, b in (shared_blocks or {}).items()})


def make_mtp(maker: Maker, resolved: ResolvedModel, *, residual: Any, positional: Any, first_attention: Any) -> list[MTPParts]:
    """``model.mtp``'s depths (none without it): each its two input norms, its block (layer index n_layers + k, after
    the main blocks, as the published checkpoints number it), its final norm, and the scheme inside its mixer.

    A depth's mixer reads the model-level scheme (the Decoder prepares it once), which must then take it at the heads
    it was sized by, or its own scheme (``model.mtp.block.positional``, or ``model.block.positional``), made as a
    layer override's is (:func:`make_layer_positional`, sized by the depth's mixer). A depth cannot read another
    layer's keys and values.
    """
    mtp, m = resolved.mtp, resolved.spec
    if mtp is None:
        return []
    mixer_path = mtp.parts["mixer"].path
    part = mtp.parts["positional"]
    depths = []
    for k in range(mtp.depths):
        block = make_block(maker, mtp.parts, m, m.n_layers + k, residual=residual)
        if kv_source_of(block.mixer) is not None:
            raise SpecError([Problem(mixer_path, "an MTP depth's mixer cannot read another layer's keys and values "
                                                 "(kv_from); leave kv_from out of model.mtp.block")])
        own = None
        if part is not resolved.positional:
            if not uses_positions(block.mixer):
                raise _no_positions(maker, part, block.mixer)
            own = make_layer_positional(maker, part, block.mixer, m)
        elif (uses_positions(block.mixer) and not maker.adds_to_embeddings(positional)
                and positional_sizes(block.mixer, d_model=m.d_model) != positional_sizes(first_attention, d_model=m.d_model)):
            raise SpecError([Problem(mixer_path, f"an MTP depth's mixer reads model.positional, which is sized for "
                                                 f"{positional_sizes(first_attention, d_model=m.d_model)} (heads, positional "
                                                 f"width); this mixer has {positional_sizes(block.mixer, d_model=m.d_model)}: "
                                                 f"give it the main layers' heads and head_dim, or its own scheme "
                                                 f"(model.mtp.block.positional)")])
        depths.append(MTPParts(make_part(maker, mtp.input_norm, dim=m.d_model),
                               make_part(maker, mtp.input_norm, dim=m.d_model), block,
                               make_part(maker, mtp.final_norm, dim=m.d_model), own))
    return depths


@dataclass
class Shapes:
    """The size flow's answer: the skeleton (no per-layer schemes) and one block per distinct layer."""

    skeleton: Skeleton
    blocks: list[tuple[Block, int]]  # (block, layers sharing it)


def size_flow(maker: Maker, resolved: ResolvedModel) -> Shapes:
    """Make one block per distinct layer (:mod:`specformer.spec.layer_groups`), check per-layer schemes, make the skeleton.

    Its cost does not grow with ``n_layers``. Both the meta-device estimate and the
    torch-free size check are this flow.
    """
    m = resolved.spec
    residual = make_residual_stream(maker, resolved)
    per_layer_input = make_per_layer_input(maker, resolved)
    width = per_layer_width(per_layer_input)
    blocks = [(make_block(maker, g.parts, m, g.group.first, residual=residual, per_layer_input=width), g.group.count)
              for g in resolved.groups]
    check_layer_positionals(maker, resolved, [(b.mixer, g.parts.get("positional"))
                                              for (b, _), g in zip(blocks, resolved.groups)])
    check_kv_sharing(maker, resolved, [b.mixer for b, _ in blocks])
    shared = make_shared_blocks(maker, resolved, residual=residual)
    first = positional_mixer([b.mixer for b, _ in blocks] + [b.mixer for b in shared.values()])
    return Shapes(make_skeleton(maker, resolved, [], first_attention=first, residual=residual,
                                per_layer_input=per_layer_input, shared_blocks=shared), blocks)


__all__ = ["Block", "MTPParts", "Maker", "Shapes", "Skeleton", "check_kv_sharing", "check_layer_positionals", "first_line",
           "layer_positionals", "make_block", "make_layer_positional", "make_part", "make_per_layer_input",
           "make_mtp", "make_residual_stream", "make_shared_blocks", "make_skeleton", "per_layer_width",
           "positional_mixer", "size_flow"]
