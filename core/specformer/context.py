"""What the Decoder hands every block on one forward pass, and the KV-cache contract."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import torch
from torch import Tensor

from specformer.model.masks import MaskInputs, MaskRule, causal_mask, dense_mask, mask_inputs  # noqa: F401 (causal_mask re-exported)
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
    # Masks built this forward (dense, or a kernel's block form), keyed by the id of the
    # key-positions tensor (kept alive alongside so the id cannot be reused) and the rule.
    _masks: dict[tuple, tuple[Tensor, Any]] = field(default_factory=dict)

    def positional_for(self, layer_index: int) -> PositionalScheme:
        """The positional scheme acting inside the attention of layer ``layer_index``."""
        return self.positional if self.layer_schemes is None else self.layer_schemes[layer_index]

    def positional_state_for(self, layer_index: int) -> Any:
        """What that scheme's ``prepare`` returned for this forward (computed once per distinct scheme)."""
        return self.positional_state if self.layer_states is None else self.layer_states[layer_index]

    def attention_mask(self, k_positions: Tensor, *, window: int | None = None, chunk: int | None = None) -> Tensor:
        """Boolean ``(B, 1, Tq, Tk)``: True where a query may attend to a key.

        The rule is :mod:`specformer.model.masks`: keys no later than the query (by column
        without a cache, by position with one), within ``window`` and the same ``chunk``
        when given, of the same document when ``document_ids`` is set, never padding.
        Padding queries attend everywhere so their rows stay finite; their outputs are
        never used. Built once per forward per key tensor and rule.
        """
        rule = MaskRule(window=window, chunk=chunk)
        return self.mask_memo(("dense", rule), k_positions, lambda inputs: dense_mask(inputs, rule))

    def mask_inputs(self, k_positions: Tensor) -> MaskInputs:
        """This forward's queries reading keys at ``k_positions`` (its own tokens when it is ``positions``)."""
        return mask_inputs(self.positions, k_positions, document_ids=self.document_ids,
                           same_tokens=k_positions is self.positions)

    def mask_memo(self, key: tuple, k_positions: Tensor, build: Callable[[MaskInputs], Any]) -> Any:
        """``build(self.mask_inputs(k_positions))``, once per forward per ``key`` and key tensor.

        So every layer with the same rule shares one mask (dense or a kernel's block mask).
        """
        if torch.compiler.is_compiling():
            # Under torch.compile an id() becomes a guard on that very tensor, so every new
            # KV cache would recompile; the compiler deduplicates the repeated work itself.
            return build(self.mask_inputs(k_positions))
        full_key = (id(k_positions), *key)
        hit = self._masks.get(full_key)
        if hit is None:
            hit = (k_positions, build(self.mask_inputs(k_positions)))
            self._masks[full_key] = hit
        return hit[1]


def default_positions(batch: int, length: int, *, device: torch.device | str) -> Tensor:
    return torch.arange(length, device=device).expand(batch, length)
