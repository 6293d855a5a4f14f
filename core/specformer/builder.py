"""The builder: the one place that turns a spec into modules.

Components receive sizes and sub-parts, never the spec. A ``ValueError`` or
``TypeError`` a component raises while being built is a problem with the spec and is
reported at the spec path of that component.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from specformer.decoder import Decoder
from specformer.errors import Problem, SpecError
from specformer.spec import Spec, load_spec
from specformer.validate import ResolvedModel, ResolvedPart, resolve_model


def build(
    spec: "Spec | str | Path | dict[str, Any]",
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    seed: int | None = None,
    registry: Any = None,
) -> Decoder:
    """Validate ``spec`` (a :class:`Spec`, a file path or a dict) and build its :class:`Decoder`.

    Weights are initialised (seeded by ``seed`` when given); ``model.spec`` holds the spec.
    """
    from specformer.plugins import get_registry

    registry = registry or get_registry()
    spec = load_spec(spec, registry=registry)
    resolved, problems = resolve_model(spec.model, registry)
    if problems:
        raise SpecError(problems)
    assert resolved is not None
    generator_state = _seeded(seed)
    with generator_state:
        model = assemble(resolved, device=device)
        model.spec = spec
        if str(device) != "meta":
            model.init_weights(std=spec.model.init_std)
    if dtype is not None:
        model = model.to(dtype=dtype)
    return model


def assemble(resolved: ResolvedModel, *, device: torch.device | str | None = None) -> Decoder:
    """Construct the modules of a resolved model (weights as PyTorch initialises them)."""
    m = resolved.spec
    multiplier = math.sqrt(m.d_model) if m.embedding_multiplier == "sqrt_d_model" else float(m.embedding_multiplier)
    with torch.device(device) if device is not None else contextlib.nullcontext():
        blocks = []
        for index, parts in enumerate(resolved.layers):
            attention = _make(parts["attention"], d_model=m.d_model, layer_index=index, n_layers=m.n_layers)
            ffn = _make(parts["ffn"], d_model=m.d_model, layer_index=index, n_layers=m.n_layers)
            make_norm = _norm_maker(parts["norm"], dim=m.d_model)
            blocks.append(
                _make(
                    parts["layout"],
                    d_model=m.d_model,
                    attention=attention,
                    ffn=ffn,
                    make_norm=make_norm,
                    layer_index=index,
                    n_layers=m.n_layers,
                )
            )
        first = blocks[0].attention
        head_dims = {b.attention.head_dim for b in blocks}
        n_heads = {b.attention.n_heads for b in blocks}
        if len(head_dims) > 1 or len(n_heads) > 1:
            # The positional scheme is shared by all layers and is sized once.
            raise SpecError(
                [Problem("model.layers", f"every layer must have the same head_dim and n_heads; got head_dim {sorted(head_dims)}, n_heads {sorted(n_heads)}")]
            )
        positional = _make(
            resolved.positional,
            d_model=m.d_model,
            n_heads=first.n_heads,
            head_dim=first.head_dim,
            context_length=m.context_length,
        )
        final_norm = _make(resolved.final_norm, dim=m.d_model)
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


def _make(part: ResolvedPart, **sizes: Any) -> Any:
    try:
        return part.resolved.make(**sizes)
    except (ValueError, TypeError) as exc:
        raise SpecError([Problem(part.path, str(exc))]) from None


def _norm_maker(part: ResolvedPart, *, dim: int) -> Callable[..., nn.Module]:
    """Layouts call this once per norm they place; ``dim`` can be overridden (e.g. for a sublayer)."""

    def make_norm(*, dim: int = dim) -> nn.Module:
        return _make(part, dim=dim)

    return make_norm


@contextlib.contextmanager
def _seeded_ctx(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _seeded(seed: int | None) -> contextlib.AbstractContextManager[None]:
    return _seeded_ctx(seed) if seed is not None else contextlib.nullcontext()
