"""The size check of a validated spec, without building and without torch.

Constraints between sizes (``n_heads`` must divide ``d_model``, a rotary width must be
even, ``top_k`` at most ``n_experts``) are each component's own: it declares them on its
``Params`` (``sized``, see :mod:`specformer.model.sized`). This check runs the builder's
size flow (:mod:`specformer.model.wiring`: which sizes each part receives, one block per
distinct layer) over those declarations instead of over modules, so every problem the
builder would meet is found here, at the same spec path and in the same words, in a
process that never imports torch. A component that declares no check is built on the
meta device for it (:mod:`specformer.model.sized_by_building`).

It also counts the model's parameters from the declarations and refuses a model whose
float32 weights no machine could address (2^63 bytes); that count is skipped when some
component does not declare its own (the meta-device estimate, :mod:`specformer.model.sizes`,
which ``build``, ``load`` and ``summary`` use, refuses such a model there).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from specformer.errors import Problem, SpecError
from specformer.model.wiring import size_flow
from specformer.model.sized import Sized, linear, total
from specformer.spec.validate import ResolvedModel, ResolvedPart

#: Largest byte count any model may have: beyond it no address space holds the weights.
ADDRESSABLE_BYTES = 2**63 - 1

#: Bytes of a float32 parameter, as a model is built.
FLOAT32_BYTES = 4


class SizedMaker:
    """The size check's :class:`~specformer.model.wiring.Maker`: each part's declared :class:`Sized` facts."""

    def make(self, part: ResolvedPart, **sizes: Any) -> Sized:
        return part.resolved.sized(**sizes)

    def adds_to_embeddings(self, scheme: Sized) -> bool:
        return scheme.adds_to_embeddings

    def name(self, made: Sized) -> str:
        return made.name

    def connection(self, stream: Sized) -> Sized:
        # A layout that declares no check is built around real connections, made by the stream built on meta.
        build = None if stream.build is None else (lambda: stream.build().connection())
        if stream.connection is None:  # a stream that does not declare its connections: one is built on meta
            from specformer.model.sized_by_building import built_on_meta  # late: imports torch

            assert build is not None, "a Sized the registry made knows how to build its component"
            return built_on_meta(build)
        return replace(stream.connection, name=stream.connection.name or "ResidualConnection", build=build)


SIZED = SizedMaker()


@dataclass(frozen=True)
class SizeCheck:
    """What the size check found: the parameter count, when every component declares its own."""

    parameters: int | None


def check_sizes(resolved: ResolvedModel) -> SizeCheck:
    """Every size constraint of ``resolved``'s components; SpecError at the path of the first that fails."""
    m = resolved.spec
    shapes = size_flow(SIZED, resolved)
    embedding = m.padded_vocab_size * m.d_model
    head = (m.padded_vocab_size if m.lm_head_bias else 0) if m.tie_embeddings \
        else linear(m.d_model, m.padded_vocab_size, bias=m.lm_head_bias)
    blocks = [None if b.block.parameters is None else b.block.parameters * count for b, count in shapes.blocks]
    skeleton = shapes.skeleton
    per_layer = skeleton.per_layer_input.parameters if skeleton.per_layer_input is not None else 0
    embedding_norm = skeleton.embedding_norm.parameters if skeleton.embedding_norm is not None else 0
    # Each MTP depth: its eh_proj (2 d_model -> d_model, no bias), two input norms, block, final norm and own scheme.
    mtp = [total(linear(2 * m.d_model, m.d_model), d.embedding_norm.parameters, d.hidden_norm.parameters,
                 d.block.block.parameters, d.final_norm.parameters,
                 d.positional.parameters if d.positional is not None else 0) for d in skeleton.mtp]
    shared = [b.parameters for b in skeleton.shared_blocks.values()]  # stored once, whatever the uses
    uses = resolved.shared_uses if m.shared_blocks else []
    # What each use has of its own (specformer.model.shared.UseParts), once per use.
    per_use = [uses.count(name) * per_use_parameters(block, d_model=m.d_model) for name, block in m.shared_blocks.items()]
    parameters = total(embedding, head, skeleton.residual.parameters, per_layer, skeleton.positional.parameters,
                       embedding_norm, skeleton.final_norm.parameters, *blocks, *mtp, *shared, *per_use)
    if parameters is not None and parameters * FLOAT32_BYTES > ADDRESSABLE_BYTES:
        raise SpecError([Problem("model", unaddressable_message(parameters * FLOAT32_BYTES, parameters))])
    return SizeCheck(parameters=parameters)


def per_use_parameters(block: Any, *, d_model: int) -> int:
    """The parameters one use of shared block ``block`` (a SharedBlockSpec) has of its own: its projection
    (d_model x d_model) and, per adapted linear map, a pair per output piece (rank x inputs, rows x rank)."""
    projection = d_model * d_model if block.projection else 0
    adapters = block.adapters
    pairs = 0 if adapters is None else sum(
        adapters.rank * (len(t.outputs) * t.inputs + sum(t.outputs)) for t in adapters.targets.values())
    return projection + pairs


def unaddressable_message(total_bytes: int, parameters: int) -> str:
    """The problem of a model larger than any address space (the check here and the meta estimate say the same)."""
    return (f"the model would need {total_bytes:.3e} bytes for its {parameters:.3e} parameters, "
            f"more than any machine can address (2^63 bytes); make the sizes smaller")


__all__ = ["ADDRESSABLE_BYTES", "SIZED", "SizeCheck", "SizedMaker", "check_sizes", "per_use_parameters", "unaddressable_message"]
