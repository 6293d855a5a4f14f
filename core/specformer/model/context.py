"""What the Decoder hands every block on one forward pass, and the KV-cache contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from specformer.model.positional import PositionalScheme


@runtime_checkable
class KVCache(Protocol):
    """Anything that stores keys and values between forward passes (the generate plugin's caches).

    ``update`` receives the new keys and values of one layer ``(B, n_kv, T, head_dim)``
    and their absolute positions ``(B, T)``, stores them, and returns the keys and values
    attention should read ``(B, n_kv, S, head_dim)`` with the absolute position of each
    slot ``(B, S)``; a negative position marks an empty or padded slot, which is never
    attended to.
    """

    def update(self, layer_index: int, key: Tensor, value: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]: ...


@dataclass
class ForwardContext:
    """Per-forward facts shared by every layer."""

    positions: Tensor  # (B, T) absolute positions of the tokens in this forward; < 0 is padding
    positional: PositionalScheme  # the model-level scheme (what was added to the embeddings)
    positional_state: Any = None
    cache: KVCache | None = None
    # Per-layer schemes (``model.layers[].positional``): layer i uses layer_schemes[i] with
    # layer_states[i]; a state object is shared by every layer with the same scheme. None:
    # every layer uses ``positional``. Read them through positional_for / positional_state_for.
    layer_schemes: Any = None
    layer_states: Any = None
    # True when positions are 0..T-1 in every row and there is no cache, so attention may
    # use the fused causal kernel instead of an explicit mask.
    plain_causal: bool = False
    # (B, T) integer document of each token (packed training): a query reads only keys of
    # its own document. None: a row is one document. Never given together with a cache.
    document_ids: Tensor | None = None
    # (B, T) the token ids of this forward, for sublayers that route by id (hash-routed experts).
    # A feed-forward reads it only when it declares ``reads_context = True``: the block then
    # calls it as ``ffn(x, ctx)`` (plain ``ffn(x)`` otherwise).
    token_ids: Tensor | None = None
    # (B, T, D) what a shared block run with ``output: mixer_input`` adds to the next block's mixer input
    # (before its norm, not to its residual); set by the decoder for that one block, None otherwise.
    mixer_addend: Tensor | None = None
    # Masks evaluated during this forward (dense, or a kernel's block form), filled by the
    # attention kernels so every layer with the same rule shares one; a fresh context per
    # forward, so they never outlive the positions they were built from.
    masks: dict[tuple, Any] = field(default_factory=dict)
    # Cross-layer KV sharing: one entry per layer whose keys and values later layers read
    # (their ``kv_from``), filled by that layer during this forward with what it attended to,
    # ``(keys, values, key positions)`` (after its cache update); the readers take them from here.
    shared_kv: dict[int, Any] = field(default_factory=dict)
    # (B, T, n_layers, width) per-layer inputs (model.per_layer_input), computed once per forward from the
    # tokens; block i reads per_layer_inputs[:, :, i]. None when the model has none.
    per_layer_inputs: Tensor | None = None

    def positional_for(self, layer_index: int) -> PositionalScheme:
        """The positional scheme acting inside the attention of layer ``layer_index``."""
        return self.positional if self.layer_schemes is None else self.layer_schemes[layer_index]

    def positional_state_for(self, layer_index: int) -> Any:
        """What that scheme's ``prepare`` returned for this forward (computed once per distinct scheme)."""
        return self.positional_state if self.layer_states is None else self.layer_states[layer_index]


def default_positions(batch: int, length: int, *, device: torch.device | str) -> Tensor:
    return torch.arange(length, device=device).expand(batch, length)
