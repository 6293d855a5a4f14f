"""The mask rule evaluated (specformer_layers.attention.masking) against masks written out with loops.

Every kernel reads its mask through this module (dense, per tile, per score), so these
tests pin the rule for all of them: causal by column without a cache and by position
with one, padding, window, chunk and documents; and the memo that builds each mask once
per forward.
"""

from __future__ import annotations

import pytest
import torch

from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule
from specformer.model.positional import PositionalScheme
from specformer_layers.attention import kernels, tiled
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.attention.masking import (
    MaskInputs,
    attention_mask,
    block_summary,
    causal_mask,
    dense_mask,
    mask_inputs,
)

from .test_backends import DOCUMENTS, padded_positions, reference_flex, reset  # noqa: F401 (a fixture)


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


def test_a_mask_is_built_once_per_forward_per_key_tensor_and_rule() -> None:
    positions = torch.tensor([[0, 1, 2]])
    context = ForwardContext(positions=positions, positional=PositionalScheme())
    keys = torch.tensor([[0, 1, 2]])
    first = attention_mask(context, keys)
    assert torch.equal(first, causal_mask(positions, keys))
    assert attention_mask(context, keys) is first  # computed once per forward
    windowed = attention_mask(context, keys, MaskRule(window=1))
    assert windowed is not first
    assert torch.equal(windowed, causal_mask(positions, keys, window=1))
    other = torch.tensor([[0, 1, -1]])  # another key tensor gets its own mask
    assert torch.equal(attention_mask(context, other), causal_mask(positions, other))


@pytest.mark.parametrize("window", [None, 2])
def test_the_traced_path_builds_the_same_mask_without_the_memo(monkeypatch, window: int | None) -> None:
    # Under torch.compile the memo is skipped (an id() would become a guard); the mask must not change.
    positions = torch.tensor([[-1, 0, 1, 2]])
    keys = torch.tensor([[0, 1, 2, 3, -1]])
    context = ForwardContext(positions=positions, positional=PositionalScheme())
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    got = attention_mask(context, keys, MaskRule(window=window))
    assert torch.equal(got, reference(positions.tolist(), keys.tolist(), window))


def test_a_chunked_rule_lets_a_query_read_only_its_own_chunk() -> None:
    positions = torch.tensor([[0, 1, 2, 3, 4]])
    context = ForwardContext(positions=positions, positional=PositionalScheme())
    expected = [[k <= q and k // 2 == q // 2 for k in range(5)] for q in range(5)]  # chunks of 2 positions
    assert attention_mask(context, positions, MaskRule(chunk=2))[0, 0].tolist() == expected
    assert attention_mask(context, positions)[0, 0].tolist() == [[k <= q for k in range(5)] for q in range(5)]


def test_packed_documents_read_only_their_own_earlier_tokens() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1]])  # the second document restarts its positions
    documents = [0, 0, 0, 1, 1]
    context = ForwardContext(positions=positions, positional=PositionalScheme(),
                             document_ids=torch.tensor([documents]))
    expected = [[k <= q and documents[k] == documents[q] for k in range(5)] for q in range(5)]  # by column
    assert attention_mask(context, positions)[0, 0].tolist() == expected  # this forward's own tokens as keys


def written_out(q_order, k_order, q_pos, k_pos, q_doc, k_doc, window, chunk):
    """allowed[b][i][j] by loops: the rule of specformer.model.masks, read aloud."""
    out = []
    for b in range(len(q_order)):
        rows = []
        for i in range(len(q_order[b])):
            row = []
            for j in range(len(k_order[b])):
                if q_order[b][i] < 0:
                    row.append(True)
                    continue
                ok = 0 <= k_order[b][j] <= q_order[b][i]
                ok = ok and (window is None or q_order[b][i] - k_order[b][j] < window)
                ok = ok and (chunk is None or q_pos[b][i] // chunk == k_pos[b][j] // chunk)
                ok = ok and (q_doc is None or q_doc[b][i] == k_doc[b][j])
                row.append(ok)
            rows.append(row)
        out.append(rows)
    return torch.tensor(out)[:, None]


@pytest.mark.parametrize("window,chunk", [(None, None), (3, None), (None, 4), (5, 3)])
def test_dense_mask_is_the_written_out_rule(window, chunk) -> None:
    positions, documents = reset(DOCUMENTS), DOCUMENTS
    for docs in (None, documents):
        inp = mask_inputs(positions, positions, document_ids=docs, same_tokens=True)
        got = dense_mask(inp, MaskRule(window=window, chunk=chunk))
        lists = [t.tolist() if t is not None else None for t in (inp.q_order, inp.k_order, inp.q_positions,
                                                                  inp.k_positions, inp.q_documents, inp.k_documents)]
        assert torch.equal(got, written_out(*lists, window, chunk))


def test_causality_without_a_cache_is_by_column_not_by_position_value() -> None:
    # Positions restart (a second document) but no document ids: a token must still not see later ones.
    positions = torch.tensor([[0, 1, 2, 0, 1]])
    mask = dense_mask(mask_inputs(positions, positions, same_tokens=True), MaskRule())[0, 0]
    assert torch.equal(mask, torch.ones(5, 5, dtype=torch.bool).tril())


def test_document_ids_refused_with_a_cache() -> None:
    positions = torch.tensor([[0, 1]])
    with pytest.raises(ValueError, match="without a cache"):
        mask_inputs(positions, torch.tensor([[0, 1]]), document_ids=torch.tensor([[0, 0]]), same_tokens=False)


@pytest.mark.parametrize("length,keys,block", [(300, 300, 128), (37, 100, 16), (64, 64, 16)])
def test_block_summary_is_the_dense_mask_reduced_per_tile(length, keys, block) -> None:
    torch.manual_seed(0)
    q_positions = torch.arange(length).expand(2, length) + torch.tensor([[0], [keys - length]])
    k_positions = torch.arange(keys).expand(2, keys).clone()
    k_positions[1, :7] = -1  # empty slots
    rule = MaskRule(window=23, chunk=40)
    inputs = MaskInputs(q_positions, k_positions, q_positions, k_positions)
    some, every = block_summary(inputs, rule, block=block)
    dense = dense_mask(inputs, rule)[:, 0]  # (B, Tq, S)
    nq, nk = -(-length // block), -(-keys // block)
    padded = torch.zeros(2, nq * block, nk * block, dtype=torch.bool)
    padded[:, :length, :keys] = dense
    real = torch.zeros_like(padded)
    real[:, :length, :keys] = True
    tiles = padded.view(2, nq, block, nk, block)
    assert torch.equal(some, tiles.any(dim=4).any(dim=2))
    # "every": all real queries of the tile see all its keys, and no key of the tile is past S.
    full_keys = real.view(2, nq, block, nk, block)[:, 0, 0].all(dim=-1)  # (2, nk)
    every_want = (tiles | ~real.view(2, nq, block, nk, block)).all(dim=4).all(dim=2) & full_keys[:, None, :]
    assert torch.equal(every, every_want)




# -- every kernel reads the keys of the rule, and only those -------------------------------------

KERNEL_RULES = {"window": MaskRule(window=3), "chunk": MaskRule(chunk=4), "chunk+window": MaskRule(window=2, chunk=5)}


def keys_read(attention, x: torch.Tensor, positions: torch.Tensor, documents: torch.Tensor | None) -> torch.Tensor:
    """(B, Tq, S) bool: query i's output moves when token j's input moves, so i reads j.

    One forward: the batch holds the rows as given, then once more per token j with j moved.
    """
    B, T, _ = x.shape
    moved = x.repeat(T + 1, 1, 1)  # (B * (T+1), T, D): copy 0 as given, copy 1 + j with token j moved
    for j in range(T):
        moved[B * (j + 1):B * (j + 2), j] += 3.0
    repeat = lambda t: None if t is None else t.repeat(T + 1, 1)  # noqa: E731
    ctx = ForwardContext(positions=repeat(positions), positional=PositionalScheme(), document_ids=repeat(documents))
    out = attention(moved, ctx).view(T + 1, B, T, -1)
    # Rows of one batch may round differently (1e-7); a key read moves the output by far more than 1e-4.
    return torch.stack([(out[j + 1] - out[0]).abs().amax(dim=-1) > 1e-4 for j in range(T)], dim=-1)  # (B, Tq, S)


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "tiled", pytest.param("flex", marks=pytest.mark.slow)])
def test_every_kernel_reads_exactly_the_keys_the_rule_allows(reference_flex, monkeypatch, kernel) -> None:
    """The rule written out with loops, against what each kernel's outputs actually depend on."""
    monkeypatch.setattr(tiled, "TILE", 4)
    monkeypatch.setattr(kernels, "TILED_MAX_COVER", 1.0)  # tiles even where they save little
    monkeypatch.setattr(kernels, "FLEX_MIN_SCORES", 0)  # FlexAttention at any size (as on an accelerator)
    taken = set()
    real_plan = kernels.plan

    def spy(*args, **kwargs):
        chosen = real_plan(*args, **kwargs)
        taken.add(chosen.kernel)
        return chosen

    monkeypatch.setattr(kernels, "plan", spy)
    backend = {"tiled": "auto", "flex": "flex"}.get(kernel, kernel)
    torch.manual_seed(0)
    x = torch.randn(2, 11, 16)
    for rule in KERNEL_RULES.values():
        attention = CausalSelfAttention(
            CausalSelfAttentionParams(n_heads=2, backend=backend, window=rule.window, chunk=rule.chunk), d_model=16)
        for positions, documents in ((padded_positions(2, 11), None), (reset(DOCUMENTS), DOCUMENTS)):
            # Tiles run where FlexAttention cannot: on CPU with gradients.
            with torch.set_grad_enabled(kernel == "tiled"):
                got = keys_read(attention, x, positions, documents)
            order = torch.where(positions >= 0, torch.arange(11), -1).tolist()
            docs = None if documents is None else documents.tolist()
            want = written_out(order, order, positions.tolist(), positions.tolist(), docs, docs, rule.window,
                               rule.chunk)[:, 0]
            real = positions >= 0  # a padding query reads everything, only to stay finite
            assert torch.equal(got[real], want[real]), (kernel, rule, documents is not None)
    assert taken == {kernel}


def test_a_chunk_with_a_cache_compares_the_positions_the_cache_stored():
    # Queries at 5 and 6 read cached keys at 0..6; chunks of 4: each reads its own chunk's keys up to itself.
    queries, keys = torch.tensor([[5, 6]]), torch.arange(7)[None]
    mask = dense_mask(mask_inputs(queries, keys), MaskRule(chunk=4))[0, 0]
    assert mask.tolist() == [[j in (4, 5) for j in range(7)], [j in (4, 5, 6) for j in range(7)]]


def test_document_ids_with_cached_keys_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"^document_ids apply to a forward without a cache \(the keys must be the same"):
        mask_inputs(torch.tensor([[3]]), torch.arange(4)[None], document_ids=torch.zeros(1, 1, dtype=torch.long))
