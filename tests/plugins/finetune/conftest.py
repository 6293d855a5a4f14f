"""Fixtures of the fine-tuning tests: a tiny model, its base checkpoint (byte tokenizer) and small data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import specformer
from specformer.tokenizers.tokenizer import METADATA_KEY, ByteTokenizer
from fixtures.tiny import tiny_spec

#: Byte-token vocabulary, context 64, 2 query heads over 1 KV head, a wider ffn: the changes to the shared tiny model.
TINY_CHANGES: dict[str, Any] = {
    "vocab_size": 259, "context_length": 64,
    "block": {"mixer": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1}, "ffn": {"kind": "swiglu", "hidden": 64}},
}
TINY_MODEL: dict[str, Any] = tiny_spec(**TINY_CHANGES)["model"]

TINY_TRAIN: dict[str, Any] = {
    "steps": 6, "batch_size": 4, "seq_len": 32, "lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 1, "eval_every": 3,
    "eval_steps": 2, "save_every": 3, "sample_tokens": 0, "progress": False, "plot": False, "tensorboard": False,
    "threads": 1,
}


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread: None) -> None:
    """Every fine-tuning test on one thread (tests/conftest.py's ``one_thread``)."""


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("SPECFORMER_CACHE", str(cache))
    return cache


def tiny_finetune_spec(**train: Any) -> dict[str, Any]:
    """The tiny model with ``TINY_TRAIN`` as its train section, ``train`` changing its fields."""
    return tiny_spec(**TINY_CHANGES, train={**TINY_TRAIN, **train})


@pytest.fixture
def base_ckpt(tmp_path: Path) -> Path:
    """A randomly initialised tiny model saved with the byte tokenizer (what an imported model looks like)."""
    model = specformer.build(tiny_spec(**TINY_CHANGES), seed=3)
    path = tmp_path / "base.safetensors"
    specformer.save(model, path, metadata={METADATA_KEY: ByteTokenizer().to_json()})
    return path


@pytest.fixture
def chat_file(tmp_path: Path) -> Path:
    path = tmp_path / "chat.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(120):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"what is {i % 5} plus one?"},
                                             {"role": "assistant", "content": f"{i % 5 + 1}."}]}) + "\n")
    return path


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    words = "the model reads tokens and predicts the next one while the optimizer follows the loss".split()
    path.write_text("\n".join(" ".join(words[(i + j) % len(words)] for j in range(9)) for i in range(600)),
                    encoding="utf-8")
    return path
