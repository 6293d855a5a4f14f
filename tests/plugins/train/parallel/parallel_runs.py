"""Helpers of the model-parallel tests (tensor, expert and context parallelism): the same training on one process as
the reference, and the checks that a parallel run matched it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

import specformer
from specformer_train.metrics import read_metrics

from ..conftest import TINY_MODEL, TINY_TRAIN, make_text
from .test_distributed import curve, train_alone, values


#: Keys of a test's block that are the model's (``model.layers``, ``model.tie_embeddings``), not the block's.
MODEL_KEYS = ("layers", "tie_embeddings")


def spec_with(block: dict, **train: object) -> dict:
    """The tiny model with ``block``'s components (and model keys) replaced, trained with ``TINY_TRAIN`` changed by
    ``train``."""
    model = {**TINY_MODEL, "block": {**TINY_MODEL["block"], **{k: v for k, v in block.items() if k not in MODEL_KEYS}}}
    model.update({k: v for k, v in block.items() if k in MODEL_KEYS})
    return {"model": model, "train": {**TINY_TRAIN, **train}}


def one_and_parallel(root: Path, block: dict, *, per_process: int = 4, optimizer: str = "adamw",
                     **train_settings: object) -> tuple[Path, Path]:
    """Train the reference (one process, 4 rows a step) into ``root/single``; the parallel run's spec
    (``per_process`` rows a process) is ``root/two.yaml``. ``train_settings``: more of both runs' ``train:``."""
    corpus = root / "corpus.txt"
    corpus.write_text(make_text(4000, seed=3))
    settings = dict(data=str(corpus), steps=4, save_every=2, eval_every=2, seed=7, cache_dir=str(root / "cache"),
                    optimizer=optimizer, **train_settings)
    (root / "one.yaml").write_text(yaml.safe_dump(spec_with(block, batch_size=4, **settings)))
    (root / "two.yaml").write_text(yaml.safe_dump(spec_with(block, batch_size=per_process, **settings)))
    train_alone(root / "one.yaml", out_dir=str(root / "single"))
    return root / "single", root / "two.yaml"


def grad_norms(out: Path) -> list[float]:
    return [r["grad_norm"] for r in read_metrics(out / "metrics.jsonl") if "grad_norm" in r]


def assert_same_weights(out: Path, reference: Path) -> None:
    ours, theirs = specformer.load(out / "model.safetensors"), specformer.load(reference / "model.safetensors")
    for (name, a), (_, b) in zip(ours.state_dict().items(), theirs.state_dict().items(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4, msg=name)


def assert_same_run(out: Path, reference: Path) -> None:
    assert curve(out) == curve(reference)
    assert values(out) == pytest.approx(values(reference), abs=1e-5)
    # the norm over split and replicated gradients (clipping is on: these norms are above train.grad_clip, 1.0)
    assert grad_norms(out) == pytest.approx(grad_norms(reference), abs=1e-5)
    assert_same_weights(out, reference)
