"""The attention mask against a mask written out with loops, and ForwardContext's mask memo."""

from __future__ import annotations

import pytest
import torch

from specformer.context import ForwardContext, causal_mask, default_positions
from specformer.positional import PositionalScheme


def reference(q_positions: list[list[int]], k_positions: list[list[int]], window: int | None) -> torch.Tensor:
    """allowed[b, 0, i, j]: key j is real, not after query i, within the window; padding queries see all."""
    rows = []
    for qs, ks in zip(q_positions, k_positions):
        rows.append([[q < 0 or (0 <= k <= q and (window is None or q - k < window)) for k in ks] for q in qs])
    return torch.tensor(rows, dtype=torch.bool)[:, None]


@pytest.mark.parametrize("window", [None, 1, 2, 3])
def test_causal_mask_matches_the_written_out_mask(window: int | None) -> None:
    # A left-padded row, a row read from a cache with an empty slot, a plain row.
    q = torch.tensor([[-1, 0, 1, 2], [3, 4, 5, 6], [0, 1, 2, 3]])
    k = torch.tensor([[-1, 0, 1, 2], [3, -1, 5, 6], [0, 1, 2, 3]])
    got = causal_mask(q, k, window=window)
    assert got.shape == (3, 1, 4, 4)
    assert torch.equal(got, reference(q.tolist(), k.tolist(), window))


def test_causal_mask_details_by_hand() -> None:
    q = torch.tensor([[0, 1, 2]])
    k = torch.tensor([[0, 1, 2]])
    # A query sees itself and earlier keys only.
    assert causal_mask(q, k)[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    # window=2: a query sees itself and one key before it.
    assert causal_mask(q, k, window=2)[0, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    # The key at position 0 is real (only negative positions are padding); a padding query sees everything.
    padded = causal_mask(torch.tensor([[-1, 0]]), torch.tensor([[-1, 0]]))
    assert padded[0, 0].int().tolist() == [[1, 1], [0, 1]]


def test_a_query_reads_more_keys_than_queries_from_a_cache() -> None:
    q = torch.tensor([[4]])  # one new token at position 4
    k = torch.tensor([[0, 1, 2, 3, 4, 5, -7]])  # 5 is a stale future slot, -7 an empty slot
    assert causal_mask(q, k)[0, 0, 0].int().tolist() == [1, 1, 1, 1, 1, 0, 0]
    assert causal_mask(q, k, window=3)[0, 0, 0].int().tolist() == [0, 0, 1, 1, 1, 0, 0]


def test_forward_context_reuses_a_mask_per_key_tensor_and_window() -> None:
    positions = torch.tensor([[0, 1, 2]])
    context = ForwardContext(positions=positions, positional=PositionalScheme())
    keys = torch.tensor([[0, 1, 2]])
    first = context.attention_mask(keys)
    assert torch.equal(first, causal_mask(positions, keys))
    assert context.attention_mask(keys) is first  # computed once per forward
    windowed = context.attention_mask(keys, window=1)
    assert windowed is not first
    assert torch.equal(windowed, causal_mask(positions, keys, window=1))
    other = torch.tensor([[0, 1, -1]])  # another key tensor gets its own mask
    assert torch.equal(context.attention_mask(other), causal_mask(positions, other))


def test_default_positions_count_from_zero_in_every_row() -> None:
    assert default_positions(2, 3, device="cpu").tolist() == [[0, 1, 2], [0, 1, 2]]


def test_default_positions_are_made_on_the_requested_device() -> None:
    assert default_positions(2, 3, device="meta").device.type == "meta"


@pytest.mark.parametrize("window", [None, 2])
def test_the_traced_path_builds_the_same_mask_without_the_memo(monkeypatch, window: int | None) -> None:
    # Under torch.compile the memo is skipped (an id() would become a guard); the mask must not change.
    positions = torch.tensor([[-1, 0, 1, 2]])
    keys = torch.tensor([[0, 1, 2, 3, -1]])
    context = ForwardContext(positions=positions, positional=PositionalScheme())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    got = context.attention_mask(keys, window=window)
    assert torch.equal(got, reference(positions.tolist(), keys.tolist(), window))


def test_a_chunked_rule_lets_a_query_read_only_its_own_chunk() -> None:
    positions = torch.tensor([[0, 1, 2, 3, 4]])
    context = ForwardContext(positions=positions, positional=PositionalScheme())
    expected = [[k <= q and k // 2 == q // 2 for k in range(5)] for q in range(5)]  # chunks of 2 positions
    assert context.attention_mask(positions, chunk=2)[0, 0].tolist() == expected
    assert context.attention_mask(positions)[0, 0].tolist() == [[k <= q for k in range(5)] for q in range(5)]


def test_packed_documents_read_only_their_own_earlier_tokens() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1]])  # the second document restarts its positions
    documents = [0, 0, 0, 1, 1]
    context = ForwardContext(positions=positions, positional=PositionalScheme(),
                             document_ids=torch.tensor([documents]))
    expected = [[k <= q and documents[k] == documents[q] for k in range(5)] for q in range(5)]  # by column
    assert context.attention_mask(positions)[0, 0].tolist() == expected  # this forward's own tokens as keys


def test_each_layer_reads_its_own_positional_scheme_and_state() -> None:
    positions = torch.tensor([[0, 1]])
    model_level, first, second = PositionalScheme(), PositionalScheme(), PositionalScheme()
    per_layer = ForwardContext(positions=positions, positional=model_level, positional_state="model",
                               layer_schemes=[first, second], layer_states=["first", "second"])
    assert per_layer.positional_for(1) is second and per_layer.positional_state_for(1) == "second"
    assert per_layer.positional_for(0) is first and per_layer.positional_state_for(0) == "first"
    shared = ForwardContext(positions=positions, positional=model_level, positional_state="model")
    assert shared.positional_for(1) is model_level and shared.positional_state_for(1) == "model"
