"""No T x T tensor for a windowed or document-masked forward: every allocation is recorded.

torch.profiler with ``profile_memory`` records the size of each allocation made during
the forward (the compiled FlexAttention kernel's own buffers included). A ``T x T`` mask
is at least ``T * T`` bytes (one byte per bool), so every allocation must stay below
that; the dense path (``backend: sdpa``) is checked to break the bound, so the
instrument can fail.
"""

from __future__ import annotations

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from specformer.model.builder import build

from ..support import VOCAB, tiny_spec_over_vocab


def largest_allocation(T: int, backend: str, *, window: int | None, documents: bool) -> int:
    spec = tiny_spec_over_vocab(context_length=T)
    spec["model"]["block"]["mixer"].update(backend=backend, **({"window": window} if window else {}))
    model = build(spec, seed=0).eval()
    ids = torch.randint(0, VOCAB, (1, T))
    document_ids = (torch.arange(T) // 1000)[None] if documents else None  # documents of 1000 tokens
    with torch.no_grad():
        model(ids, document_ids=document_ids)  # compile outside the recording
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recording:
            model(ids, document_ids=document_ids)
    return max(event.cpu_memory_usage for event in recording.events())


@pytest.mark.slow
@pytest.mark.parametrize("window,documents", [(512, False), (None, True), (512, True)])
def test_no_t_by_t_allocation_at_8192(window: int | None, documents: bool) -> None:
    T = 8192
    assert largest_allocation(T, "auto", window=window, documents=documents) < T * T


def test_the_dense_path_does_allocate_t_by_t() -> None:
    T = 1024
    assert largest_allocation(T, "sdpa", window=256, documents=True) >= T * T
