"""Document masking in packed training: the layout of a row, the packed-loss equality, the settings on resume."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import specformer
from specformer_train import train
from specformer_train.checkpointing import latest_checkpoint
from specformer_train.documents import document_ids, document_layout, document_positions, document_settings

from .conftest import TINY_MODEL, tiny_train_spec

EOT = 256  # the byte tokenizer's <|endoftext|>


def test_document_ids_count_end_of_text_tokens_up_to_each_position() -> None:
    row = np.array([[5, 6, EOT, 7, 8, 9, EOT, 1]])
    assert document_ids(row, eot_id=EOT).tolist() == [[0, 0, 1, 1, 1, 1, 2, 2]]
    assert document_positions(row, eot_id=EOT).tolist() == [[0, 1, 0, 1, 2, 3, 0, 1]]


def test_each_row_is_laid_out_on_its_own() -> None:
    rows = np.array([[EOT, 1, 2, EOT], [1, EOT, EOT, 2]])
    assert document_ids(rows, eot_id=EOT).tolist() == [[1, 1, 1, 2], [0, 1, 2, 2]]
    assert document_positions(rows, eot_id=EOT).tolist() == [[0, 1, 2, 0], [0, 0, 0, 1]]


def test_a_batch_without_a_boundary_after_its_first_token_keeps_the_plain_causal_path() -> None:
    plain = document_layout(np.array([[EOT, 1, 2, 3], [4, 5, 6, 7]]), eot_id=EOT, document_mask=True,
                            reset_positions=True)
    assert plain.document_ids is None and plain.positions is None
    packed = np.array([[1, EOT, 2, 3], [4, 5, 6, 7]])
    only_mask = document_layout(packed, eot_id=EOT, document_mask=True, reset_positions=False)
    assert only_mask.positions is None and only_mask.document_ids.tolist() == [[0, 1, 1, 1], [0, 0, 0, 0]]
    only_positions = document_layout(packed, eot_id=EOT, document_mask=False, reset_positions=True)
    assert only_positions.document_ids is None and only_positions.positions.tolist() == [[0, 0, 1, 2], [0, 1, 2, 3]]
    off = document_layout(packed, eot_id=EOT, document_mask=False, reset_positions=False)
    assert off.document_ids is None and off.positions is None


def test_settings_default_to_true_and_a_resumed_run_keeps_what_it_recorded() -> None:
    assert document_settings(document_mask=None, reset_positions=None) == {"document_mask": True,
                                                                           "reset_positions": True}
    recorded = {"document_mask": False, "reset_positions": True}
    assert document_settings(document_mask=None, reset_positions=None, recorded=recorded, resumed=True) == recorded
    assert document_settings(document_mask=True, reset_positions=None, recorded=recorded, resumed=True) == {
        "document_mask": True, "reset_positions": True}
    # A checkpoint from before the settings existed trained across documents: it goes on that way.
    assert document_settings(document_mask=None, reset_positions=None, recorded=None, resumed=True) == {
        "document_mask": False, "reset_positions": False}


# -- the packed-loss equality -----------------------------------------------------------


def _model(positional: dict[str, Any]) -> torch.nn.Module:
    model = copy.deepcopy(TINY_MODEL)
    model["positional"] = positional
    decoder = specformer.build({"model": model}, seed=3)
    return decoder.eval()


def _per_token_losses(model: torch.nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                      **layout: np.ndarray | None) -> torch.Tensor:
    given = {k: torch.from_numpy(v) for k, v in layout.items() if v is not None}
    logits = model(inputs, **given)  # (B, T, vocab)
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


def _packed_documents(seed: int) -> tuple[list[list[int]], torch.Tensor]:
    """A row of a leading fragment and three documents, each followed by the end-of-text token."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 256, size=n).tolist() for n in (6, 9, 5)]
    fragment = rng.integers(0, 256, size=4).tolist()
    stream = fragment + [EOT]
    for doc in docs:
        stream += doc + [EOT]
    return docs, torch.tensor([stream])  # (1, T + 1)


@pytest.mark.parametrize("positional", [{"kind": "rope"}, {"kind": "learned"}, {"kind": "alibi"},
                                        {"kind": "sinusoidal"}], ids=lambda p: p["kind"])
def test_a_packed_row_with_document_masking_has_the_losses_of_each_document_alone(positional: dict) -> None:
    torch.manual_seed(0)
    model = _model(positional)
    docs, row = _packed_documents(seed=1)
    inputs, targets = row[:, :-1], row[:, 1:]
    layout = document_layout(inputs.numpy(), eot_id=EOT, document_mask=True, reset_positions=True)
    with torch.no_grad():
        packed = _per_token_losses(model, inputs, targets, document_ids=layout.document_ids,
                                   positions=layout.positions)[0]
        crossing = _per_token_losses(model, inputs, targets)[0]  # today's packing: attention crosses documents
        start = inputs[0].tolist().index(EOT)  # the first document starts at the first end-of-text token
        for doc in docs:
            alone = torch.tensor([[EOT, *doc, EOT]])
            expected = _per_token_losses(model, alone[:, :-1], alone[:, 1:])[0]
            got = packed[start : start + len(doc) + 1]
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            if start > 0:  # every document after the row's start sees other text without the mask
                assert (crossing[start : start + len(doc) + 1] - expected).abs().max() > 1e-3
            start += len(doc) + 1


def test_without_the_mask_only_positions_restart_and_the_losses_differ() -> None:
    model = _model({"kind": "rope"})
    docs, row = _packed_documents(seed=2)
    inputs, targets = row[:, :-1], row[:, 1:]
    layout = document_layout(inputs.numpy(), eot_id=EOT, document_mask=False, reset_positions=True)
    with torch.no_grad():
        packed = _per_token_losses(model, inputs, targets, positions=layout.positions)[0]
        last = docs[-1]
        alone = torch.tensor([[EOT, *last, EOT]])
        expected = _per_token_losses(model, alone[:, :-1], alone[:, 1:])[0]
    assert (packed[-len(last) - 1 :] - expected).abs().max() > 1e-3


# -- in the trainer --------------------------------------------------------------------


def _documents_file(tmp_path: Path, n: int = 40) -> Path:
    rng = np.random.default_rng(0)
    lines = [json.dumps({"text": " ".join(["word"] * int(rng.integers(3, 20)))}) for _ in range(n)]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _pieces(row: list[int]) -> list[list[int]]:
    """A row cut before each end-of-text token: the leading fragment, then each document as it runs alone."""
    cuts = [i for i, token in enumerate(row) if token == EOT and i > 0]
    return [row[a:b] for a, b in zip([0, *cuts], [*cuts, len(row)]) if b > a]


@pytest.mark.parametrize("masked", [True, False])
def test_evaluation_masks_documents_as_training_does(tmp_path: Path, masked: bool) -> None:
    from specformer.tokenizers.tokenizer import ByteTokenizer
    from specformer_train.config import TrainSpec
    from specformer_train.data import EvalRows, PackedRows
    from specformer_train.trainer import Trainer

    rng = np.random.default_rng(5)
    stream = []
    for _ in range(12):
        stream += [EOT, *rng.integers(0, 256, size=int(rng.integers(2, 12))).tolist()]
    tokens = np.array(stream, dtype=np.int64)
    model = _model({"kind": "rope"})
    config = TrainSpec(**{**tiny_train_spec()["train"], "eval_steps": None, "batch_size": 2, "device": "cpu",
                            "document_mask": masked, "reset_positions": masked})
    trainer = Trainer(model=model, config=config, train_rows=PackedRows(tokens, seq_len=16, seed=0),
                      val_rows=EvalRows(tokens, seq_len=16), tokenizer=ByteTokenizer(), out_dir=tmp_path)
    got = trainer.evaluate()

    # Reference: each row's inputs cut into documents, each run alone (masked), or the whole row (not masked).
    total, count = 0.0, 0
    with torch.no_grad():
        for index in range(trainer.val_rows.count):
            row = tokens[index * 16 : index * 16 + 17].tolist()
            inputs, targets = row[:-1], row[1:]
            pieces = _pieces(inputs) if masked else [inputs]
            at = 0
            for piece in pieces:
                logits = model(torch.tensor([piece]))[0]
                total += F.cross_entropy(logits, torch.tensor(targets[at : at + len(piece)]), reduction="sum").item()
                at += len(piece)
            count += len(targets)
    assert got == pytest.approx(total / count, abs=1e-5)


def test_the_settings_are_recorded_and_kept_on_resume(tmp_path: Path) -> None:
    data = _documents_file(tmp_path)
    out = tmp_path / "run"
    train(tiny_train_spec(data=str(data), out_dir=str(out), steps=2, eval_every=0, document_mask=False))
    state = json.loads((latest_checkpoint(out) / "trainer.json").read_text())
    assert state["extra"]["documents"] == {"document_mask": False, "reset_positions": True}
    train(tiny_train_spec(data=str(data), out_dir=str(out), steps=4, eval_every=0), resume=True)
    state = json.loads((latest_checkpoint(out) / "trainer.json").read_text())
    assert state["step"] == 4 and state["extra"]["documents"] == {"document_mask": False, "reset_positions": True}
