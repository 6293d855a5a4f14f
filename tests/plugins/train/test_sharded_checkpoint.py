"""Sharded checkpoints on one process: the exact round trip, the files (safetensors and JSON only, never a pickle),
consolidation into the single file ``specformer.load`` reads, and every way a damaged one is refused.

The multi-process cases (FSDP2 and tensor parallelism saving, resuming on another mesh) are in
test_sharded_distributed.py."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import save_file

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.cli.main import main
from specformer.errors import CheckpointError, UserError
from specformer.tokenizers.tokenizer import METADATA_KEY, ByteTokenizer
from specformer_train import train
from specformer_train.checkpointing import (DamagedCheckpoint, TrainerState, load_checkpoint, read_checkpoint,
                                            save_checkpoint)
from specformer_train.config import TrainSpec
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.metrics import read_metrics
from specformer_train.optim import make_optimizer
from specformer_train.resume import find_resumable
from specformer_train.sharded_checkpoint import INDEX, consolidate, shard_file, use_sharded

from .conftest import TINY_MODEL, TINY_TRAIN, make_text
from .test_checkpointing import MODEL, TOO_DEEP, trained


def save_sharded(out: Path, step: int, *, model_and_optimizer: tuple | None = None, keep_last: int = 10) -> Path:
    model, optimizer = model_and_optimizer or trained()
    return save_checkpoint(out_dir=out, model=model, optimizer=optimizer, state=TrainerState(step=step),
                           tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=keep_last, sharded=True)


def assert_no_pickle(directory: Path) -> None:
    """Every file is JSON or safetensors (an 8-byte length, a JSON header, raw tensor bytes) and reads back as such:
    nothing a pickle loader would open."""
    files = sorted(p for p in directory.rglob("*") if p.is_file())
    assert files
    for path in files:
        assert path.suffix in (".json", ".safetensors"), path
        data = path.read_bytes()
        if path.suffix == ".json":
            json.loads(data.decode("utf-8"))
        else:
            length = int.from_bytes(data[:8], "little")
            assert isinstance(json.loads(data[8:8 + length].decode("utf-8")), dict), path
            with safe_open(str(path), framework="pt") as f:
                list(f.keys())


@pytest.mark.parametrize("kind", ["adamw", "muon", "lion", "sgd"])
def test_a_sharded_checkpoint_restores_weights_optimizer_and_rng_exactly(tmp_path: Path, kind: str) -> None:
    model, optimizer = trained(0, optimizer=kind)
    torch.manual_seed(123)
    random.seed(4)
    path = save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer,
                           state=TrainerState(step=7, sequences=28, tokens=896), tokenizer=ByteTokenizer(),
                           ctx=ParallelLayout(), keep_last=3, sharded=True)
    expected_draws = (torch.rand(3), random.random())
    assert sorted(p.name for p in path.iterdir()) == [
        "rng-rank0.safetensors", shard_file(0), INDEX, "tokenizer.json", "trainer.json"]
    assert_no_pickle(path)

    other, other_optimizer = trained(1, optimizer=kind)
    torch.manual_seed(999)
    loaded = load_checkpoint(path, model=other, optimizer=other_optimizer, tokenizer=ByteTokenizer(), ctx=ParallelLayout())
    assert (loaded.step, loaded.sequences, loaded.tokens) == (7, 28, 896)
    for (name, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), other.parameters()):
        saved, restored = optimizer.state[p], other_optimizer.state[q]
        assert saved.keys() == restored.keys() and saved, kind
        for key, value in saved.items():
            assert torch.equal(value, restored[key]) if isinstance(value, torch.Tensor) else value == restored[key], key
    assert [g["lr"] for g in other_optimizer.param_groups] == [g["lr"] for g in optimizer.param_groups]
    draws = (torch.rand(3), random.random())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1] == expected_draws[1]


def test_consolidating_gives_the_file_specformer_load_reads(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    model, optimizer = trained(0)
    path = save_sharded(tmp_path, 3, model_and_optimizer=(model, optimizer))
    out = tmp_path / "one.safetensors"
    assert main(["checkpoint", "consolidate", str(path), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    loaded = specformer.load(out)
    assert loaded.spec.to_json() == model.spec.to_json()
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    header = read_metadata(out)
    assert json.loads(header[METADATA_KEY]) == json.loads(ByteTokenizer().to_json()) and header["train_step"] == "3"
    # the same header a full checkpoint's model.safetensors has
    full = save_checkpoint(out_dir=tmp_path / "full", model=model, optimizer=optimizer, state=TrainerState(step=3),
                           tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=1)
    assert header == read_metadata(full / "model.safetensors")
    # by default, beside the shards; the run directory stands for its latest checkpoint, then read as that file
    assert main(["checkpoint", "consolidate", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {path / 'model.safetensors'}"
    assert torch.equal(specformer.load(path / "model.safetensors").embedding.weight, model.embedding.weight)
    assert torch.equal(specformer.load(tmp_path).embedding.weight, model.embedding.weight)
    assert read_checkpoint(path).sharded is not None  # still resumed from its shards


def test_loading_a_sharded_checkpoint_directory_says_to_consolidate_it(tmp_path: Path) -> None:
    path = save_sharded(tmp_path, 1)
    with pytest.raises(CheckpointError, match=rf"^{path}: .*a sharded training checkpoint; write its single file with "
                                              rf"`specformer checkpoint consolidate {path}`"):
        specformer.load(path)


def _bad(args: list[str], capsys: pytest.CaptureFixture) -> str:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_consolidate_refuses_what_is_not_a_sharded_checkpoint_in_one_line(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture) -> None:
    assert "not a directory" in _bad(["checkpoint", "consolidate", str(tmp_path / "nowhere")], capsys)
    (tmp_path / "empty").mkdir()
    assert "not a sharded checkpoint (no sharded.json)" in _bad(["checkpoint", "consolidate", str(tmp_path / "empty")],
                                                               capsys)
    model, optimizer = trained(0)
    full = save_checkpoint(out_dir=tmp_path / "full", model=model, optimizer=optimizer, state=TrainerState(step=1),
                           tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=1)
    assert "a full checkpoint already" in _bad(["checkpoint", "consolidate", str(full)], capsys)
    sharded = save_sharded(tmp_path / "sharded", 1)
    (sharded / shard_file(0)).unlink()
    assert f"{sharded / shard_file(0)}: missing" in _bad(["checkpoint", "consolidate", str(sharded)], capsys)
    assert not (sharded / "model.safetensors").exists()
    with pytest.raises(SystemExit, match="2"):  # no action: argparse's usage error
        main(["checkpoint"])
    assert "required: ACTION" in capsys.readouterr().err


@pytest.mark.parametrize("damage, message", [
    ("missing shard", r"shard-rank00000.safetensors: missing"),
    ("truncated shard", r"shard-rank00000.safetensors: not a readable shard"),
    ("garbage index", r"sharded.json: not readable JSON"),
    ("other format", r"sharded.json: unknown format"),
    ("index without tensors", r"sharded.json: not a sharded checkpoint index"),
    ("unknown dtype", r"sharded.json: not a sharded checkpoint index \(ValueError: dtype 'float99'\)"),
    ("shard elsewhere", r"sharded.json: not a sharded checkpoint index \(ValueError: file '../x.safetensors'\)"),
    ("garbage slices", r"shard-rank00000.safetensors: its slices header is not a map of blocks"),
    ("block outside", r"shard-rank00000.safetensors: its block 'model/embedding.weight@0,0' does not fit"),
    ("a block lost", r"the shards hold \d+ of the \d+ values of model/embedding.weight"),
])
def test_a_damaged_sharded_checkpoint_names_the_bad_file(tmp_path: Path, damage: str, message: str) -> None:
    path = save_sharded(tmp_path, 1)
    shard, index = path / shard_file(0), path / INDEX
    if damage == "missing shard":
        shard.unlink()
    elif damage == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:200])
    elif damage == "garbage index":
        index.write_text("{not json")
    elif damage in ("other format", "index without tensors", "unknown dtype", "shard elsewhere"):
        data = json.loads(index.read_text())
        if damage == "other format":
            data["format"] = "other/1"
        elif damage == "index without tensors":
            del data["tensors"]
        elif damage == "unknown dtype":
            data["tensors"]["model/embedding.weight"]["dtype"] = "float99"
        else:
            data["files"] = ["../x.safetensors"]
        index.write_text(json.dumps(data))
    else:  # the shard's header no longer describes the embedding's block as written
        with safe_open(str(shard), framework="pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        slices = json.loads(metadata["slices"])
        if damage == "a block lost":
            del slices["model/embedding.weight@0,0"]
        elif damage == "garbage slices":
            slices["model/embedding.weight@0,0"] = 7
        else:
            slices["model/embedding.weight@0,0"][1] = [1, 0]
        save_file(tensors, str(shard), {"slices": json.dumps(slices)})
    with pytest.raises(DamagedCheckpoint, match=message):
        read_checkpoint(path)
    with pytest.raises(DamagedCheckpoint, match=message):
        consolidate(path, tmp_path / "out.safetensors")


def test_resume_falls_back_past_a_sharded_checkpoint_with_a_missing_shard(tmp_path: Path) -> None:
    save_sharded(tmp_path, 1)
    newest = save_sharded(tmp_path, 2)
    (newest / shard_file(0)).unlink()
    said: list[str] = []
    contents = find_resumable(tmp_path, True, say=said.append)
    assert contents.state.step == 1 and contents.sharded is not None
    assert said[0].startswith("warning: cannot resume from step-0000002: ") and shard_file(0) in said[0]
    assert said[1] == "note: resuming from step-0000001, the newest intact checkpoint"
    with pytest.raises(UserError, match=rf"the checkpoint is damaged: .*{shard_file(0)}: missing"):
        find_resumable(tmp_path, newest)


def test_a_sharded_checkpoint_of_another_model_or_optimizer_is_refused(tmp_path: Path) -> None:
    path = save_sharded(tmp_path, 1)
    bigger = specformer.build({"model": {**MODEL, "d_model": 48}}, seed=0)
    with pytest.raises(CheckpointError, match=r"does not fit the model of this spec .*'embedding.weight \(259, 16\) vs \(259, 48\)'"):
        load_checkpoint(path, model=bigger, optimizer=make_optimizer(bigger, TrainSpec(), device=torch.device("cpu")),
                        tokenizer=ByteTokenizer(), ctx=ParallelLayout())
    model = specformer.build({"model": MODEL}, seed=0)
    with pytest.raises(CheckpointError, match="trained with the optimizer AdamW, this spec's train.optimizer builds"):
        load_checkpoint(path, model=model, tokenizer=ByteTokenizer(), ctx=ParallelLayout(),
                        optimizer=make_optimizer(model, TrainSpec(optimizer="lion"), device=torch.device("cpu")))


def test_the_format_is_chosen_by_train_checkpoint_format() -> None:
    assert TrainSpec().checkpoint_format == "full"
    with pytest.raises(ValueError, match="checkpoint_format"):
        TrainSpec(checkpoint_format="pickle")
    assert use_sharded("auto", mode="fsdp", tp=1, adapter=False)
    assert use_sharded("auto", mode="tp", tp=2, adapter=False)
    assert not use_sharded("auto", mode="ddp", tp=1, adapter=False)
    assert not use_sharded("auto", mode="none", tp=1, adapter=False)
    assert use_sharded("sharded", mode="none", tp=1, adapter=False)
    assert not use_sharded("full", mode="fsdp", tp=2, adapter=False)
    assert not use_sharded("auto", mode="fsdp", tp=1, adapter=True)  # an adapter's checkpoint stays full
    with pytest.raises(UserError, match="sharded does not store adapter runs"):
        use_sharded("sharded", mode="fsdp", tp=1, adapter=True)
    assert not use_sharded("auto", mode="fsdp", tp=1, adapter=False, ep=2)  # each process' experts are its own
    with pytest.raises(UserError, match=r"sharded does not store expert-parallel runs \(train.parallel.ep 2\)"):
        use_sharded("sharded", mode="ddp", tp=1, adapter=False, ep=2)


def test_a_sharded_run_resumes_exactly_and_ends_with_the_consolidated_model(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(make_text(3000, seed=3))
    settings = {**TINY_TRAIN, "data": str(corpus), "steps": 4, "save_every": 2, "eval_every": 2, "seed": 7,
                "cache_dir": str(tmp_path / "cache")}
    (tmp_path / "full.yaml").write_text(yaml.safe_dump({"model": TINY_MODEL, "train": settings}))
    (tmp_path / "sharded.yaml").write_text(yaml.safe_dump(
        {"model": TINY_MODEL, "train": {**settings, "checkpoint_format": "sharded"}}))
    train(tmp_path / "full.yaml", out_dir=str(tmp_path / "full"))
    train(tmp_path / "sharded.yaml", out_dir=str(tmp_path / "sharded"))
    resumed = tmp_path / "resumed" / "checkpoints"
    resumed.mkdir(parents=True)
    shutil.copytree(tmp_path / "sharded" / "checkpoints" / "step-0000002", resumed / "step-0000002")
    (resumed / "latest").write_text("step-0000002")
    train(tmp_path / "sharded.yaml", out_dir=str(tmp_path / "resumed"), resume=True)

    def losses(out: Path) -> list[tuple[int, float]]:
        return [(r["step"], r.get("loss", r.get("val_loss"))) for r in read_metrics(out / "metrics.jsonl")]

    assert losses(tmp_path / "sharded") == losses(tmp_path / "full")  # the same run, bit for bit on one process
    assert losses(tmp_path / "resumed") == [entry for entry in losses(tmp_path / "full") if entry[0] > 2]
    reference = specformer.load(tmp_path / "full" / "model.safetensors").state_dict()
    for out in ("sharded", "resumed"):
        assert_no_pickle(tmp_path / out / "checkpoints" / "step-0000004")
        assert not (tmp_path / out / "checkpoints" / "step-0000004" / "model.safetensors").exists()
        weights = specformer.load(tmp_path / out / "model.safetensors").state_dict()
        for name, tensor in reference.items():
            assert torch.equal(weights[name], tensor), (out, name)


# -- forged checkpoints: written by someone else, every file untrusted ------------------------------------------------

EMBEDDING = "model/embedding.weight"  # (259, 16) float32, one block at 0,0 in the one shard


def rewrite_index(path: Path, edit: Any) -> None:
    """``edit(index)`` changes the parsed sharded.json in place, which is written back."""
    data = json.loads((path / INDEX).read_text())
    edit(data)
    (path / INDEX).write_text(json.dumps(data))


def rewrite_shard(path: Path, edit: Any) -> None:
    """``edit(tensors, slices)`` changes rank 0's stored blocks and their slices header in place."""
    shard = path / shard_file(0)
    with safe_open(str(shard), framework="pt") as f:
        slices = json.loads(f.metadata()["slices"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    edit(tensors, slices)
    save_file(tensors, str(shard), {"slices": json.dumps(slices)})


def split_embedding(blocks: list[tuple[list[int], tuple[slice, slice]]]) -> Any:
    """An edit replacing the embedding's block by blocks cut from it: (offsets, the part of the weight they hold)."""
    def edit(tensors: dict[str, torch.Tensor], slices: dict[str, Any]) -> None:
        whole = tensors.pop(f"{EMBEDDING}@0,0")
        del slices[f"{EMBEDDING}@0,0"]
        for number, (offsets, part) in enumerate(blocks):
            key = f"{EMBEDDING}@forged{number}"
            tensors[key] = whole[part].clone()
            slices[key] = [EMBEDDING, offsets]
    return edit


def recast(key: str, dtype: torch.dtype) -> Any:
    def edit(tensors: dict[str, torch.Tensor], slices: dict[str, Any]) -> None:
        tensors[key] = tensors[key].to(dtype)
    return edit


def without_step_tensor(data: dict[str, Any]) -> None:
    """The embedding's step count moved from a tensor to the scalars, as a string."""
    del data["tensors"]["optimizer/embedding.weight/step"]
    data["optimizer"]["scalars"]["embedding.weight/step"] = "x"


FORGED = {
    # 1. blocks that hold as many values as the tensor but overlap, leaving others unwritten
    "two blocks over the same rows": (
        lambda p: rewrite_shard(p, split_embedding([([0, 0], (slice(0, 130), slice(None))),
                                                    ([0, 0], (slice(0, 129), slice(None)))])),
        rf"the blocks of {EMBEDDING} overlap: '{EMBEDDING}@forged1' in {shard_file(0)} and '{EMBEDDING}@forged0' "
        rf"in {shard_file(0)} hold some of the same values; expected every value in exactly one block"),
    "overlapping rows, one row uncovered": (
        lambda p: rewrite_shard(p, split_embedding([([0, 0], (slice(0, 130), slice(None))),
                                                    ([129, 0], (slice(129, 258), slice(None)))])),
        rf"the blocks of {EMBEDDING} overlap"),
    "overlapping columns": (  # a block is a rectangle: columns count as rows do
        lambda p: rewrite_shard(p, split_embedding([([0, 0], (slice(None), slice(0, 8))),
                                                    ([0, 7], (slice(None), slice(7, 15)))])),
        rf"the blocks of {EMBEDDING} overlap"),
    "an empty block": (
        lambda p: rewrite_shard(p, split_embedding([([0, 0], (slice(None), slice(None))),
                                                    ([0, 0], (slice(0, 0), slice(None)))])),
        rf"its block '{EMBEDDING}@forged1' holds no values; a block holds at least one"),
    # 2. a block listed many times, and declared sizes beyond the values stored
    "a shard listed twice": (
        lambda p: rewrite_index(p, lambda d: d.update(files=d["files"] * 2, world_size=2)),
        rf"sharded.json: not a sharded checkpoint index \(ValueError: file '{shard_file(0)}' listed 2 times\)"),
    "a huge declared tensor": (  # refused by the count of stored values, before anything is allocated
        lambda p: rewrite_index(p, lambda d: [d["tensors"][name].update(shape=[10**9, 10**9]) for name in (
            EMBEDDING, "optimizer/embedding.weight/exp_avg", "optimizer/embedding.weight/exp_avg_sq")]),
        rf"the shards hold 4144 of the {10**18} values of {EMBEDDING}"),
    "optimizer state of no parameter": (
        lambda p: rewrite_index(p, lambda d: d["tensors"].update(
            {"optimizer/evil.weight/exp_avg": {"shape": [3], "dtype": "float32"}})),
        r"the state 'evil.weight/exp_avg' belongs to no parameter of the saved weights and groups"),
    "optimizer state of another shape": (
        lambda p: rewrite_index(p, lambda d: d["tensors"]["optimizer/embedding.weight/exp_avg"].update(shape=[259, 1])),
        r"the state of 'embedding.weight' does not match the saved weights \(exp_avg shaped \[259, 1\], "
        r"expected \[259, 16\] or \[\] for a count\)"),
    "a tensor of neither model nor optimizer": (
        lambda p: rewrite_index(p, lambda d: d["tensors"].update({"other/x": {"shape": [1], "dtype": "float32"}})),
        r"tensor 'other/x' \(neither model/ nor optimizer/\)"),
    "a group naming no parameter": (
        lambda p: rewrite_index(p, lambda d: d["optimizer"]["param_groups"][0]["params"].append("evil.weight")),
        r"group 0's params must name stored parameters, each in one group"),
    # 3. a file nested too deeply to parse
    "index nested too deeply": (
        lambda p: (p / INDEX).write_text(TOO_DEEP),
        r"sharded.json: not readable JSON \(nested too deeply to parse\)"),
    "slices nested too deeply": (
        lambda p: save_file({"x": torch.zeros(1)}, str(p / shard_file(0)), {"slices": TOO_DEEP}),
        rf"{shard_file(0)}: not a readable shard \(RecursionError"),
    "tokenizer nested too deeply": (
        lambda p: rewrite_index(p, lambda d: d["header"].update({METADATA_KEY: TOO_DEEP})),
        rf"sharded.json \({METADATA_KEY} in the header\): not readable JSON \(nested too deeply"),
    # 4. optimizer state of the wrong type
    "a step that is a string": (
        lambda p: (rewrite_index(p, without_step_tensor),
                   rewrite_shard(p, lambda t, s: (t.pop("optimizer/embedding.weight/step@"),
                                                  s.pop("optimizer/embedding.weight/step@")))),
        r"the state 'embedding.weight/step' is 'x', expected a number"),
    "a step both tensor and scalar": (
        lambda p: rewrite_index(p, lambda d: d["optimizer"]["scalars"].update({"embedding.weight/step": 3})),
        r"the state 'embedding.weight/step' is stored both as a tensor and as a scalar"),
    "a moment of integers": (
        lambda p: (rewrite_index(p, lambda d: d["tensors"]["optimizer/embedding.weight/exp_avg"].update(dtype="int64")),
                   rewrite_shard(p, recast("optimizer/embedding.weight/exp_avg@0,0", torch.int64))),
        r"the state 'embedding.weight/exp_avg' is int64, expected a floating dtype"),
    "a group setting nested in a list": (
        lambda p: rewrite_index(p, lambda d: d["optimizer"]["param_groups"][0].update(lr=[[0.1]])),
        r"group 0's 'lr' is not a number, boolean, null, string or a flat list of them"),
    # 5. a block stored in another dtype than the index says
    "int64 stored for float32": (
        lambda p: rewrite_shard(p, recast(f"{EMBEDDING}@0,0", torch.int64)),
        rf"its block '{EMBEDDING}@0,0' is stored as I64; sharded.json says {EMBEDDING} is float32, expected F32"),
    "float16 stored for float32": (
        lambda p: rewrite_shard(p, recast(f"{EMBEDDING}@0,0", torch.float16)),
        rf"its block '{EMBEDDING}@0,0' is stored as F16; sharded.json says {EMBEDDING} is float32, expected F32"),
    "int8 declared over float blocks": (
        lambda p: rewrite_index(p, lambda d: d["tensors"][EMBEDDING].update(dtype="int8")),
        rf"its block '{EMBEDDING}@0,0' is stored as F32; sharded.json says {EMBEDDING} is int8, expected I8"),
}


@pytest.mark.parametrize("forgery", FORGED)
def test_a_forged_sharded_checkpoint_is_refused_in_one_line_and_resume_falls_back(
        tmp_path: Path, forgery: str, capsys: pytest.CaptureFixture) -> None:
    forge, message = FORGED[forgery]
    save_sharded(tmp_path, 1)
    path = save_sharded(tmp_path, 2)
    forge(path)
    with pytest.raises(DamagedCheckpoint, match=message):
        read_checkpoint(path)
    out = tmp_path / "out.safetensors"
    assert re.search(message, _bad(["checkpoint", "consolidate", str(path), "--out", str(out)], capsys))
    assert not out.exists() and not list(tmp_path.glob(".out.safetensors*"))  # nothing written, not even in part
    said: list[str] = []
    assert find_resumable(tmp_path, True, say=said.append).state.step == 1
    assert said[0].startswith("warning: cannot resume from step-0000002: ") and re.search(message, said[0])


def test_a_tensor_the_model_does_not_have_is_refused_by_consolidate_and_resume(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = save_sharded(tmp_path, 1)
    rewrite_index(path, lambda d: d["tensors"].update({"model/evil.weight": {"shape": [2], "dtype": "float32"}}))
    rewrite_shard(path, lambda t, s: (t.update({"model/evil.weight@0": torch.ones(2)}),
                                      s.update({"model/evil.weight@0": ["model/evil.weight", [0]]})))
    out = tmp_path / "out.safetensors"
    err = _bad(["checkpoint", "consolidate", str(path), "--out", str(out)], capsys)
    assert err.startswith(f"error: {path / INDEX}: does not match its spec") and "holds 9 tensors" in err, err
    assert not out.exists()
    model = specformer.build({"model": MODEL}, seed=0)
    with pytest.raises(CheckpointError, match=r"does not fit the model of this spec \(missing none, unexpected "
                                              r"\['evil.weight'\], mis-shaped none\)"):
        load_checkpoint(path, model=model, optimizer=make_optimizer(model, TrainSpec(), device=torch.device("cpu")),
                        tokenizer=ByteTokenizer(), ctx=ParallelLayout())


def test_a_group_setting_of_another_kind_than_the_optimizer_takes_is_refused(tmp_path: Path) -> None:
    path = save_sharded(tmp_path, 1)
    rewrite_index(path, lambda d: d["optimizer"]["param_groups"][0].update(lr="x"))
    model, optimizer = trained(1)
    with pytest.raises(CheckpointError, match=r"the stored optimizer settings are not of the kind AdamW takes "
                                              r"\(group 0's lr is 'x', expected one like 0.001\)"):
        load_checkpoint(path, model=model, optimizer=optimizer, tokenizer=ByteTokenizer(), ctx=ParallelLayout())


def test_consolidate_force_replaces_its_own_earlier_output_but_never_an_input(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = save_sharded(tmp_path, 1)
    assert main(["checkpoint", "consolidate", str(path)]) == 0
    assert "already exists; pass --force" in _bad(["checkpoint", "consolidate", str(path)], capsys)
    assert main(["checkpoint", "consolidate", str(path), "--force"]) == 0  # the earlier default output is no input
    assert torch.equal(specformer.load(path / "model.safetensors").embedding.weight, trained()[0].embedding.weight)
    for read in (path / INDEX, path / shard_file(0)):
        before = read.read_bytes()
        assert "an input of this command" in _bad(["checkpoint", "consolidate", str(path), "--out", str(read),
                                                   "--force"], capsys)
        assert read.read_bytes() == before
