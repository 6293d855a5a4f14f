"""Slow: specs/tiny-alternating.json trains compiled, on packed documents with document masking, and learns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import specformer.model.decoder
from specformer_train import train
from specformer_train.metrics import read_metrics

from .conftest import TINY_TRAIN, make_text

SPEC = Path(__file__).resolve().parents[3] / "specs" / "tiny-alternating.json"


@pytest.mark.slow
def test_tiny_alternating_trains_compiled_with_document_masks(tmp_path: Path, monkeypatch) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(120):  # short documents: several end-of-text boundaries in every 64-token row
        (corpus / f"doc{i:03d}.txt").write_text(make_text(12, seed=i), encoding="utf-8")
    seen = []
    check = specformer.model.decoder.check_document_ids

    def recording(document_ids, input_ids, **kwargs):
        seen.append(tuple(document_ids.shape))
        return check(document_ids, input_ids, **kwargs)

    monkeypatch.setattr(specformer.model.decoder, "check_document_ids", recording)
    spec = json.loads(SPEC.read_text(encoding="utf-8"))
    spec["train"] = {**TINY_TRAIN, "data": str(corpus), "out_dir": str(tmp_path / "out"), "steps": 300,
                     "eval_every": 0, "save_every": 0, "warmup_steps": 20, "compile": True,
                     "document_mask": True, "reset_positions": True}
    train(spec)
    losses = [r["loss"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl") if r["kind"] == "train"]
    assert seen, "the model was never given document ids"
    assert len(losses) >= 250
    first, last = sum(losses[:20]) / 20, sum(losses[-20:]) / 20
    assert last < first - 1.0, (first, last)
