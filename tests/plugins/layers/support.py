"""Shared helpers of the layers plugin's tests: tiny specs, a plain KV cache, a forward context."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from specformer.model.context import ForwardContext
from specformer.model.positional import PositionalScheme
from fixtures.tiny import tiny_spec

VOCAB = 61
D_MODEL = 32
N_HEADS = 4
HEAD_DIM = D_MODEL // N_HEADS

#: The kinds whose components make up a Decoder (the sampler kind belongs to generation).
LAYER_KINDS = ("positional", "rope_scaling", "norm", "ffn", "mixer", "layout", "router")


def tiny_spec_over_vocab(**model_changes: Any) -> dict[str, Any]:
    """The shared tiny spec (fixtures/tiny.py) over ``VOCAB`` ids; ``model_changes`` go to it as they are."""
    return tiny_spec(**{"vocab_size": VOCAB, **model_changes})


def spec_with(kind: str, ref: dict[str, Any]) -> dict[str, Any]:
    """The tiny spec with the component ``ref`` (``{kind: name, **params}``) of ``kind`` in its place."""
    spec = tiny_spec_over_vocab()
    model = spec["model"]
    if kind == "positional":
        model["positional"] = ref
    elif kind == "rope_scaling":
        model["positional"] = {"kind": "rope", "scaling": ref}
    elif kind == "norm":
        model["block"]["norm"] = ref
        model["final_norm"] = ref
    elif kind in ("ffn", "mixer", "layout"):
        model["block"][kind] = ref
        if kind == "mixer" and ref.get("kind") == "none":
            # Blocks without a mixer (Nemotron-H's MLP layers) beside one with attention, so the model still
            # reads other tokens and keeps a cache; nothing of the first reads positions.
            model["layers"] = [{"select": 1, "mixer": {"kind": "attention", "n_heads": N_HEADS}}]
    elif kind == "router":
        model["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "router": ref}
    else:
        raise ValueError(f"no place for a {kind} component in a Decoder spec")
    return spec


class ListCache:
    """The simplest KV cache: per layer, concatenate what every step adds."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def update(self, layer_index: int, key: Tensor, value: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if layer_index in self.layers:
            k, v, p = self.layers[layer_index]
            key, value, positions = torch.cat((k, key), 2), torch.cat((v, value), 2), torch.cat((p, positions), 1)
        self.layers[layer_index] = (key, value, positions)
        return key, value, positions


def context(positions: Tensor, positional: PositionalScheme | None = None, *, plain_causal: bool = False,
            cache: Any = None) -> ForwardContext:
    """What the Decoder would hand a block for tokens at ``positions``."""
    positional = positional if positional is not None else PositionalScheme()
    return ForwardContext(positions=positions, positional=positional, positional_state=positional.prepare(positions),
                          cache=cache, plain_causal=plain_causal)


def causal_positions(batch: int, length: int) -> Tensor:
    return torch.arange(length).expand(batch, length)
