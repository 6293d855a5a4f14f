"""Memory a generation call will need, computed from sizes before anything is allocated.

``--num-beams 1000000`` or a very large batch would otherwise start allocating a KV cache
of terabytes and take the machine down with it. :func:`check_generation_memory` adds up
the big buffers of a call arithmetically (the KV cache, the token tables, the logits
workspace, the prefill activations) and refuses a call whose estimate exceeds the
limit: the ``max_memory`` argument (``--max-memory`` of ``specformer generate``), else
core's limit (:mod:`specformer.machine.memory`: ``SPECFORMER_MAX_MEMORY``, else the memory
available on the device, within the process's address-space and control-group limits). The
estimate is a floor: small temporaries are not counted; should an allocation fail anyway, the
CLI says so in one line (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specformer.model.attention import cache_slots_of, heads_of, reach_of
from specformer.model.state import layer_states
from specformer.errors import InputError, MemoryLimitError
from specformer.machine.memory import ENV_VAR, memory_limit, parse_bytes
from specformer.messages import format_bytes


def parse_max_memory(value: Any) -> int | None:
    """Bytes from an int or a size such as ``"8GiB"``, ``"500MB"``, ``"2G"``; None for ``"unlimited"``."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str):
        try:
            return parse_bytes(value)
        except InputError:
            pass
    raise InputError(f"max_memory must be a size such as 8GiB, 500MB, a number of bytes or 'unlimited', "
                     f"got {str(value)[:40]!r}")


@dataclass(frozen=True)
class Estimate:
    """The big buffers of one call, in bytes."""

    cache: int
    tokens: int
    logits: int
    activations: int

    @property
    def total(self) -> int:
        return self.cache + self.tokens + self.logits + self.activations


def estimate(model: Any, *, rows: int, width: int, new_tokens: int, candidates: int = 0, use_cache: bool = True) -> Estimate:
    """Bytes for ``rows`` sequences (batch x beams) of ``width`` prompt columns plus ``new_tokens``.

    ``candidates``: beam search's candidate rows per step (``K`` per prompt, summed). The
    cache holds, per attention layer, keys and values ``rows x n_kv_heads x slots x
    head_dim`` (slots: the window for ring layers), and per recurrent layer its state per row;
    token tables are int64; the logits
    workspace is a few float32 ``rows x vocab`` tensors; the prefill holds the hidden states
    and the attention mask or scores of ``width`` queries against every slot.
    """
    element = next(model.parameters()).element_size()
    length = width + new_tokens
    cache = 0
    largest_layer = 0
    slot_sizes: set[int] = set()
    widest_heads = 1
    for module, state in zip(model.attention_modules(), layer_states(model)):
        window = reach_of(module)  # an AttentionLayer's public facts: its window or chunk
        slots = window if (use_cache and window is not None and window < length) else length
        heads = heads_of(module)  # None: a mixer without heads scores nothing
        widest_heads = max(widest_heads, heads.n_heads if heads is not None else 1)
        layer = 0
        kept = cache_slots_of(module)  # what the layer declares it keeps per token (None: nothing)
        if use_cache and kept is not None:
            slot_sizes.add(slots)
            layer += rows * slots * kept.bytes_per_token(element)
        # and per sequence, whatever the length (a recurrent mixer or feed-forward)
        if use_cache and state is not None:
            layer += rows * state.bytes_per_sequence(element, length)
        cache += layer
        largest_layer = max(largest_layer, layer)
    cache += rows * sum(slot_sizes) * 8 if use_cache else 0
    # Beam search reorders the cache a layer at a time (KVCache.reorder): one layer's copy is alive beside it.
    cache += largest_layer if candidates else 0
    tokens = (2 * rows + 2 * candidates) * length * 8  # history/running/finished and beam candidates
    logits = 4 * (rows + candidates) * model.vocab_size * 4
    # Prefill: a handful of (rows, width, d_model) hidden states and one (rows, heads, width, slots) score tensor.
    activations = rows * width * (8 * model.d_model * element + widest_heads * length * 4)
    return Estimate(cache=cache, tokens=tokens, logits=logits, activations=activations)


def check_generation_memory(need: Estimate, *, device: torch.device, max_memory: Any = None,
                            what: str = "generation") -> None:
    """Raise :class:`~specformer.errors.MemoryLimitError` when ``need`` exceeds the limit (see the module doc)."""
    if max_memory is not None:
        limit, source = parse_max_memory(max_memory), f"max_memory={max_memory}"
    else:
        limit, source = memory_limit(device)
    if limit is None or need.total <= limit:
        return
    raise MemoryLimitError(
        f"{what} needs about {format_bytes(need.total)} (KV cache {format_bytes(need.cache)}, logits "
        f"{format_bytes(need.logits)}, prefill {format_bytes(need.activations)}, token tables "
        f"{format_bytes(need.tokens)}), more than the limit of {format_bytes(limit)} ({source}); use fewer beams, "
        f"prompts or new tokens, or raise the limit with --max-memory SIZE (max_memory= in Python) or the "
        f"{ENV_VAR} environment variable, e.g. {ENV_VAR}=64GiB or 'unlimited'"
    )
