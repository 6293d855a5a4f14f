"""Assembling: the modules of a resolved model, wired together.

The size flow (which sizes each part receives) is :mod:`specformer.model.wiring`, shared
with the torch-free size check; here it runs over :class:`ModuleMaker`, which constructs
each component. :func:`assemble` builds the whole model once (:func:`specformer.build`);
:func:`make_decoder` also wraps the skeleton the meta-device estimate makes
(:mod:`specformer.model.sizes`).
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import nn

from specformer.errors import Problem, SpecError
from specformer.model.decoder import Decoder
from specformer.model.mtp import MTPDepth
from specformer.model.positional import adds_to_embeddings
from specformer.model.residual import ResidualConnection, ResidualStream
from specformer.model.wiring import (Skeleton, first_line, make_block, make_per_layer_input, make_residual_stream,
                                     make_shared_blocks,
                                     make_skeleton, per_layer_width, positional_mixer)
from specformer.spec.validate import ResolvedModel, ResolvedPart


class ModuleMaker:
    """The builder's :class:`~specformer.model.wiring.Maker`: each part constructed as its module."""

    def make(self, part: ResolvedPart, **sizes: Any) -> nn.Module:
        return part.resolved.make(**sizes)

    def adds_to_embeddings(self, scheme: Any) -> bool:
        return adds_to_embeddings(scheme)

    def name(self, made: Any) -> str:
        return type(made).__name__

    def connection(self, stream: ResidualStream) -> ResidualConnection:
        return stream.connection()


MODULES = ModuleMaker()


def assemble(resolved: ResolvedModel, *, device: torch.device | str | None = None) -> Decoder:
    """Construct the modules of a resolved model (weights as PyTorch initialises them)."""
    m = resolved.spec
    with torch.device(device) if device is not None else contextlib.nullcontext():
        residual = make_residual_stream(MODULES, resolved)
        per_layer_input = make_per_layer_input(MODULES, resolved)
        width = per_layer_width(per_layer_input)
        made = [make_block(MODULES, parts, m, index, residual=residual, per_layer_input=width)
                for index, parts in enumerate(resolved.layers)]
        attentions = [b.mixer for b in made]
        shared = make_shared_blocks(MODULES, resolved, residual=residual)
        first = positional_mixer(attentions + [b.mixer for b in shared.values()])
        skeleton = make_skeleton(MODULES, resolved, attentions, first_attention=first,
                                 residual=residual, per_layer_input=per_layer_input, shared_blocks=shared)
        return make_decoder(resolved, skeleton, [b.block for b in made])


def make_decoder(resolved: ResolvedModel, skeleton: Skeleton, blocks: list[nn.Module]) -> Decoder:
    """The Decoder around ``blocks`` (possibly none, for size estimates): embedding, positional, residual stream,
    norm, head, and the per-layer input part the blocks were made for."""
    m = resolved.spec
    multiplier = math.sqrt(m.d_model) if m.embedding_multiplier == "sqrt_d_model" else float(m.embedding_multiplier)
    try:
        return Decoder(
            vocab_size=m.vocab_size,
            padded_vocab_size=m.padded_vocab_size,
            d_model=m.d_model,
            context_length=m.context_length,
            positional=skeleton.positional,
            layer_positionals=skeleton.layer_positionals,
            layer_scheme=skeleton.layer_scheme,
            blocks=blocks,
            final_norm=skeleton.final_norm,
            embedding_norm=skeleton.embedding_norm,
            residual=skeleton.residual,
            tie_embeddings=m.tie_embeddings,
            lm_head_bias=m.lm_head_bias,
            embedding_multiplier=multiplier,
            logit_softcap=m.logit_softcap,
            logit_scale=m.logit_scale,
            embedding_dropout=m.embedding_dropout,
            per_layer_input=skeleton.per_layer_input,
            mtp=[MTPDepth(d_model=m.d_model, embedding_norm=d.embedding_norm, hidden_norm=d.hidden_norm,
                          block=d.block.block, final_norm=d.final_norm, positional=d.positional) for d in skeleton.mtp],
            mtp_loss_weights=m.mtp.weights() if m.mtp is not None else (),
            shared_blocks=skeleton.shared_blocks,
            shared_uses=resolved.shared_uses if skeleton.shared_blocks and blocks else None,
            shared_options=dict(m.shared_blocks) if skeleton.shared_blocks and blocks else None,
        )
    except ValueError as exc:
        if not skeleton.shared_blocks:
            raise
        raise SpecError([Problem("model.layers", first_line(exc))]) from None
    except (RuntimeError, OverflowError) as exc:
        raise SpecError([Problem("model", f"sizes too large for a tensor ({first_line(exc)})")]) from None
    except TypeError as exc:
        if "Overflow" not in str(exc):
            raise
        # A size of 2**63 or more: torch cannot even unpack it ("Overflow when unpacking long long"; found by fuzzing).
        raise SpecError([Problem("model", f"sizes too large for a tensor ({first_line(exc)})")]) from None


__all__ = ["MODULES", "ModuleMaker", "assemble", "make_decoder"]
