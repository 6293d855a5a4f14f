"""Training checkpoints saved when the block's token mixer was called `attention` resume exactly.

Such a checkpoint differs from one saved now only in its names: ``blocks.N.attention.*``
for the weights, the optimizer's state slots and parameter groups (and a sharded
checkpoint's index and shard headers), and ``attention:`` in its stored spec. The
checkpoints here are saved now and then given those names back (:func:`as_saved_before`).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specformer.renamed import RenamedWarning
from specformer.tokenizers.tokenizer import ByteTokenizer
from specformer_train.checkpointing import TrainerState, load_checkpoint, save_checkpoint
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.sharded_checkpoint import consolidate

from .test_checkpointing import trained


def _old(text: str) -> str:
    # the spec in a header, and the same spec as a string inside sharded.json
    return text.replace(".mixer.", ".attention.").replace('"mixer":', '"attention":').replace('\\"mixer\\":', '\\"attention\\":')


def as_saved_before(directory: Path) -> int:
    """Rename every name in the checkpoint files under ``directory`` as specformer wrote them before; how many."""
    renamed = 0
    for path in sorted(directory.rglob("*")):
        if path.suffix == ".json":
            text = path.read_text()
            path.write_text(_old(text))
            renamed += text != _old(text)
        elif path.suffix == ".safetensors":
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}
            old = {_old(name): tensor for name, tensor in tensors.items()}
            renamed += sum(a != b for a, b in zip(tensors, old))
            save_file(old, str(path), metadata={k: _old(v) for k, v in metadata.items()})
    return renamed


def assert_resumed(model: torch.nn.Module, optimizer: Any, other: torch.nn.Module, other_optimizer: Any) -> None:
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), other.parameters()):
        saved, restored = optimizer.state[p], other_optimizer.state[q]
        assert saved.keys() == restored.keys() and saved
        for key, value in saved.items():
            assert torch.equal(value, restored[key]) if isinstance(value, torch.Tensor) else value == restored[key]


@pytest.mark.parametrize("sharded", [False, True], ids=["full", "sharded"])
def test_a_training_checkpoint_saved_before_the_rename_resumes_exactly(tmp_path: Path, sharded: bool) -> None:
    model, optimizer = trained(0)
    path = save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer, state=TrainerState(step=3),
                           tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=1, sharded=sharded)
    assert as_saved_before(path) > 0
    files = "".join(p.read_text(errors="ignore") for p in path.rglob("*") if p.is_file())
    assert ".mixer." not in files and ".attention." in files  # saved as before: nothing says mixer
    other, other_optimizer = trained(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedWarning)  # resuming reads names; the spec comes from the run's file
        state = load_checkpoint(path, model=other, optimizer=other_optimizer, tokenizer=ByteTokenizer(),
                                ctx=ParallelLayout())
    assert state.step == 3
    assert_resumed(model, optimizer, other, other_optimizer)
    if sharded:  # and its consolidated file is a model specformer.load reads, named as now
        with pytest.warns(RenamedWarning, match="sharded.json: model.block.attention"):
            out = consolidate(path, tmp_path / "whole.safetensors")
        with safe_open(str(out), framework="pt") as f:
            names = list(f.keys())
            assert not any(".attention." in n for n in names) and any(".mixer." in n for n in names)
            assert json.loads(f.metadata()["spec"])["model"]["block"]["mixer"]["kind"] == "attention"
