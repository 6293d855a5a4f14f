"""Training checkpoints: the exact round trip of model, optimizer and RNG; the directory protocol (names,
``latest``, repairs after a kill, pruning, clearing an earlier run); what each file holds; and every way reading
refuses a damaged or mismatched checkpoint."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
import random
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.torch import save_file
import torch

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.errors import CheckpointError
from specformer.registry.hookspecs import hookimpl
from specformer.registry.discovery import get_plugin_manager
from specformer.tokenizers.tokenizer import ByteTokenizer, METADATA_KEY
from specformer_text import OutputError
from specformer_train.checkpointing import (CheckpointContents, DamagedCheckpoint, TRAINER_FORMAT, TrainerState,
                                            apply_checkpoint, checkpoint_root, clear_earlier_run, earlier_run_files,
                                            latest_checkpoint, latest_name, load_checkpoint, prune, read_checkpoint,
                                            recover_interrupted_saves, save_checkpoint, step_dirs, step_name,
                                            tokenizer_file_text)
from specformer_train.config import TrainSpec
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.optim import make_optimizer

from fixtures.tiny import tiny_spec


MODEL: dict[str, Any] = tiny_spec(
    vocab_size=259, d_model=16, n_layers=1, context_length=8,
    block={"mixer": {"kind": "attention", "n_heads": 2}, "ffn": {"kind": "swiglu", "hidden": 32}},
)["model"]


def trained(seed: int = 0, **settings: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A model and its optimizer after two steps, so that the optimizer has state."""
    model = specformer.build({"model": MODEL}, seed=seed)
    optimizer = make_optimizer(model, TrainSpec(**settings), device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    for _ in range(2):
        model(torch.randint(0, 259, (2, 8), generator=generator)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return model, optimizer


def save(out: Path, step: int, *, keep_last: int = 10, model_and_optimizer: tuple | None = None,
         state: TrainerState | None = None) -> Path:
    model, optimizer = model_and_optimizer or trained()
    return save_checkpoint(out_dir=out, model=model, optimizer=optimizer, state=state or TrainerState(step=step),
                           tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=keep_last)


def fake_step_dirs(out: Path, *steps: int) -> Path:
    root = checkpoint_root(out)
    for step in steps:
        (root / step_name(step)).mkdir(parents=True)
    return root


def test_round_trip_restores_weights_optimizer_and_rng_exactly(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    state = TrainerState(step=7, sequences=28, tokens=896, elapsed_s=1.5)
    torch.manual_seed(123)
    random.seed(4)
    np.random.seed(5)
    path = save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer, state=state,
                           tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=3)
    expected_draws = (torch.rand(3), random.random(), np.random.rand())

    other, other_optimizer = trained(1)
    torch.manual_seed(999)
    loaded = load_checkpoint(path, model=other, optimizer=other_optimizer, tokenizer=ByteTokenizer(), ctx=ParallelLayout())
    assert (loaded.step, loaded.sequences, loaded.tokens) == (7, 28, 896)
    for (name, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), other.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][key], other_optimizer.state[q][key]), key
    draws = (torch.rand(3), random.random(), np.random.rand())
    assert torch.equal(draws[0], expected_draws[0]) and draws[1:] == expected_draws[1:]


def test_a_checkpoint_of_another_model_is_refused_clearly(tmp_path: Path) -> None:
    model, optimizer = trained(0)
    path = save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer, state=TrainerState(step=1),
                           tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=1)
    bigger = specformer.build({"model": {**MODEL, "d_model": 48}}, seed=0)
    with pytest.raises(specformer.CheckpointError, match=r"does not fit the model of this spec .*mis-shaped"):
        load_checkpoint(path, model=bigger, optimizer=make_optimizer(bigger, TrainSpec(), device=torch.device("cpu")),
                        tokenizer=ByteTokenizer(), ctx=ParallelLayout())
    (path / "optimizer.safetensors").unlink()
    with pytest.raises(specformer.CheckpointError, match=r"not a complete training checkpoint \(no optimizer.safetensors\)"):
        load_checkpoint(path, model=model, optimizer=optimizer, tokenizer=ByteTokenizer(), ctx=ParallelLayout())


# -- names, latest, repairs -------------------------------------------------------------


def test_step_directories_are_found_oldest_first_and_nothing_else_counts(tmp_path: Path) -> None:
    assert step_name(12) == "step-0000012" and checkpoint_root(tmp_path) == tmp_path / "checkpoints"
    assert step_dirs(tmp_path) == []  # no checkpoints folder yet
    root = fake_step_dirs(tmp_path, 20, 3, 100)
    (root / "step-0000007").write_text("a file, not a checkpoint")
    for name in (".step-0000009.tmp-1", "step-x", "step-0000011.bak", "latest"):
        (root / name).mkdir()
    assert step_dirs(tmp_path) == [(3, root / "step-0000003"), (20, root / "step-0000020"),
                                   (100, root / "step-0000100")]
    assert earlier_run_files(tmp_path) == ["step-0000003", "step-0000020", "step-0000100"]
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert earlier_run_files(tmp_path)[-1] == "model.safetensors"


def test_latest_is_read_stripped_and_only_names_an_existing_step_directory(tmp_path: Path) -> None:
    assert latest_name(tmp_path) is None and latest_checkpoint(tmp_path) is None
    root = fake_step_dirs(tmp_path, 4)
    (root / "latest").write_text("  step-0000004\n")
    assert latest_name(tmp_path) == "step-0000004"
    assert latest_checkpoint(tmp_path) == root / "step-0000004"
    (root / "latest").write_text("step-0000008")  # named, but not there
    assert latest_checkpoint(tmp_path) is None
    (root / "other").mkdir()
    (root / "latest").write_text("other")  # there, but not a step directory
    assert latest_checkpoint(tmp_path) is None
    (root / "latest").write_text("\n")
    assert latest_name(tmp_path) is None
    (root / "latest").write_bytes(b"\xff\xfe")
    assert latest_name(tmp_path) is None


def test_recovery_restores_an_orphaned_old_copy_and_removes_unfinished_ones(tmp_path: Path) -> None:
    assert recover_interrupted_saves(tmp_path) == []
    root = fake_step_dirs(tmp_path, 6)
    for name in (".step-0000004.old-1", ".step-0000006.old-2", ".step-0000008.tmp-3"):
        (root / name).mkdir()
        (root / name / "marker").write_text(name)
    (root / ".step-0000009.tmp-4").write_text("a file, left alone")
    (root / "notes").mkdir()
    notes = recover_interrupted_saves(tmp_path)
    assert notes == [f"restored {root / 'step-0000004'}, which an interrupted save had moved aside"]
    assert (root / "step-0000004" / "marker").read_text() == ".step-0000004.old-1"
    assert not (root / "step-0000006" / "marker").exists()  # the complete step-6 wins over its old copy
    assert sorted(p.name for p in root.iterdir()) == [".step-0000009.tmp-4", "notes", "step-0000004", "step-0000006"]
    assert recover_interrupted_saves(tmp_path) == []


def test_clearing_an_earlier_run_removes_its_outputs_and_nothing_else(tmp_path: Path) -> None:
    root = fake_step_dirs(tmp_path, 2, 4)
    (root / "latest").write_text("step-0000004")
    (root / ".step-0000006.tmp-1").mkdir()
    (root / ".step-0000006.old-1").write_text("")
    (root / "mine").mkdir()
    for name in ("model.safetensors", "tokenizer.json", "loss.png", "notes.txt"):
        (tmp_path / name).write_text(name)
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events").write_text("")
    assert clear_earlier_run(tmp_path) == 2
    assert sorted(p.name for p in root.iterdir()) == ["mine"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "notes.txt"]
    assert clear_earlier_run(tmp_path / "empty") == 0


def test_pruning_keeps_the_newest_and_never_the_one_just_saved(tmp_path: Path) -> None:
    fake_step_dirs(tmp_path, 1, 5, 6, 7)
    prune(tmp_path, keep_last=2, keep=checkpoint_root(tmp_path) / step_name(6))
    assert [s for s, _ in step_dirs(tmp_path)] == [6, 7]
    fake_step_dirs(tmp_path, 1, 5)
    prune(tmp_path, keep_last=2, keep=checkpoint_root(tmp_path) / step_name(1))  # step 1 saved again after a resume
    assert [s for s, _ in step_dirs(tmp_path)] == [1, 6, 7]
    prune(tmp_path, keep_last=5, keep=checkpoint_root(tmp_path) / step_name(1))
    assert [s for s, _ in step_dirs(tmp_path)] == [1, 6, 7]


# -- saving -------------------------------------------------------------------------------


def test_a_checkpoint_holds_every_file_with_its_contents(tmp_path: Path) -> None:
    model, optimizer = trained()
    state = TrainerState(step=3, sequences=12, tokens=96, elapsed_s=1.5, threads=2, last_val_loss=2.5,
                         data={"kind": "x"}, extra={"documents": {"document_mask": True}})
    torch.manual_seed(7)
    random.seed(8)
    np.random.seed(9)
    path = save(tmp_path, 3, model_and_optimizer=(model, optimizer), state=state)
    assert path == checkpoint_root(tmp_path) / "step-0000003"
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors", "optimizer.safetensors",
                                                      "rng-rank0.safetensors", "tokenizer.json", "trainer.json"]
    assert sorted(p.name for p in checkpoint_root(tmp_path).iterdir()) == ["latest", "step-0000003"]
    assert (checkpoint_root(tmp_path) / "latest").read_text() == "step-0000003"
    header = read_metadata(path / "model.safetensors")
    assert header["train_step"] == "3" and json.loads(header[METADATA_KEY]) == {"kind": "byte"}
    assert json.loads((path / "tokenizer.json").read_text()) == {"kind": "byte"}
    assert json.loads((path / "trainer.json").read_text()) == {
        "format": TRAINER_FORMAT, "step": 3, "sequences": 12, "tokens": 96, "elapsed_s": 1.5, "world_size": 1,
        "threads": 2, "last_val_loss": 2.5, "data": {"kind": "x"}, "extra": {"documents": {"document_mask": True}}}
    with safe_open(str(path / "optimizer.safetensors"), framework="pt") as f:
        meta = f.metadata()
        names = set(f.keys())
        exp_avg = f.get_tensor("embedding.weight/exp_avg")
    assert meta["optimizer"] == "AdamW"
    groups = json.loads(meta["param_groups"])
    assert len(groups) == len(optimizer.param_groups) and groups[0]["betas"] == list(optimizer.param_groups[0]["betas"])
    assert {n for n in names if n.endswith("/exp_avg")} == {f"{n}/exp_avg" for n, _ in model.named_parameters()}
    weight = dict(model.named_parameters())["embedding.weight"]
    assert torch.equal(exp_avg, optimizer.state[weight]["exp_avg"])
    with safe_open(str(path / "rng-rank0.safetensors"), framework="pt") as f:
        rng_meta = f.metadata()
        assert torch.equal(f.get_tensor("torch_cpu"), torch.manual_seed(7).get_state())
    random.seed(8)
    version, internal, gauss = random.getstate()
    assert json.loads(rng_meta["python"]) == [version, list(internal), gauss]
    np.random.seed(9)
    name, keys, pos, has_gauss, cached = np.random.get_state()
    assert json.loads(rng_meta["numpy"]) == [name, keys.tolist(), pos, has_gauss, cached]


def test_saving_a_step_again_replaces_it_and_pruning_follows(tmp_path: Path) -> None:
    pair = trained()
    for step in (1, 2, 3):
        save(tmp_path, step, keep_last=2, model_and_optimizer=pair)
    assert [s for s, _ in step_dirs(tmp_path)] == [2, 3]
    first = (checkpoint_root(tmp_path) / "step-0000003" / "model.safetensors").read_bytes()
    other = trained(seed=1)
    save(tmp_path, 3, keep_last=2, model_and_optimizer=other)
    assert (checkpoint_root(tmp_path) / "step-0000003" / "model.safetensors").read_bytes() != first
    assert sorted(p.name for p in checkpoint_root(tmp_path).iterdir()) == ["latest", "step-0000002", "step-0000003"]


def test_a_failed_save_puts_the_old_copy_back_and_says_which_checkpoint_is_latest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pair = trained()
    final = save(tmp_path, 2, model_and_optimizer=pair)
    before = (final / "model.safetensors").read_bytes()
    replace = os.replace

    def failing(src: Any, dst: Any) -> None:
        if Path(src).name.startswith(".step-") and ".tmp-" in Path(src).name:  # the new copy's rename into place
            if Path(dst).name == "step-0000002":  # the old copy was moved aside first
                assert any(p.name.startswith(".step-0000002.old-") for p in Path(src).parent.iterdir())
            raise OSError(28, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OutputError) as info:
        save(tmp_path, 2, model_and_optimizer=trained(seed=1))
    assert str(info.value) == (f"could not save checkpoint {final}: No space left on device; "
                               f"the latest checkpoint is still {final}")
    assert (final / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in checkpoint_root(tmp_path).iterdir()) == ["latest", "step-0000002"]
    with pytest.raises(OutputError, match=r"; no earlier checkpoint was changed$"):
        save(tmp_path / "fresh", 1, model_and_optimizer=pair)
    assert sorted(p.name for p in checkpoint_root(tmp_path / "fresh").iterdir()) == []


def test_the_tokenizer_file_is_the_hugging_face_json_when_there_is_one() -> None:
    class Inner:
        def to_str(self) -> str:
            return '{"model": "bpe"}'

    class Wrapped(ByteTokenizer):
        inner = Inner()

    assert tokenizer_file_text(Wrapped()) == '{"model": "bpe"}'
    assert tokenizer_file_text(ByteTokenizer()) == ByteTokenizer().to_json()


# -- reading and applying -----------------------------------------------------------------


def test_reading_returns_every_part_and_applying_restores_them(tmp_path: Path) -> None:
    model, optimizer = trained()
    torch.manual_seed(3)
    random.seed(4)
    np.random.seed(5)
    path = save(tmp_path, 5, model_and_optimizer=(model, optimizer),
                state=TrainerState(step=5, sequences=20, tokens=160))
    expected = (torch.rand(2), random.random(), float(np.random.rand()))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    contents = read_checkpoint(path)
    assert torch.equal(torch.get_rng_state(), before), "reading checks the RNG states but must not keep them"
    assert contents.path == path and contents.tokenizer_json == ByteTokenizer().to_json()
    assert (contents.state.step, contents.state.sequences, contents.state.tokens) == (5, 20, 160)
    assert contents.optimizer["optimizer"] == "AdamW" and contents.rng is not None
    assert isinstance(contents.optimizer["param_groups"][0]["betas"], tuple)
    assert set(contents.optimizer["state"]["embedding.weight"]) == {"exp_avg", "exp_avg_sq", "step"}
    other, other_optimizer = trained(seed=1)
    state = apply_checkpoint(contents, model=other, optimizer=other_optimizer, tokenizer=ByteTokenizer())
    assert state is contents.state
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    for p, q in zip(model.parameters(), other.parameters()):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[p][key], other_optimizer.state[q][key]), key
    assert torch.equal(torch.rand(2), expected[0]) and (random.random(), float(np.random.rand())) == expected[1:]


def test_rng_states_carry_over_only_to_the_same_process_count_and_rank(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    assert read_checkpoint(path, rank=0, world_size=1).rng is not None
    assert read_checkpoint(path, rank=0, world_size=2).rng is None  # another number of processes
    assert read_checkpoint(path, rank=1, world_size=1).rng is None  # no rng-rank1 file
    contents = read_checkpoint(path, world_size=2)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    model, optimizer = trained()
    torch.set_rng_state(before)
    apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=ByteTokenizer())
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("missing", ["model.safetensors", "optimizer.safetensors", "trainer.json"])
def test_a_checkpoint_missing_a_file_is_damaged_and_named(tmp_path: Path, missing: str) -> None:
    path = save(tmp_path, 1)
    (path / missing).unlink()
    with pytest.raises(DamagedCheckpoint, match=rf"^{path}: not a complete training checkpoint \(no {missing}\)$"):
        read_checkpoint(path)
    with pytest.raises(DamagedCheckpoint, match="no such checkpoint directory"):
        read_checkpoint(tmp_path / "nowhere")


def rewrite_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("change, message", [
    ({"format": "other/1"}, "unknown format; expected 'specformer-train-state/1'"),
    ({"world_size": 0}, "must be non-negative integers"),
    ({"tokens": -1}, "must be non-negative integers"),
    ({"sequences": 1.0}, "must be non-negative integers"),
    ({"threads": True}, "wrong type"),
    ({"elapsed_s": None}, "wrong type"),
    ({"step": -1}, r"trainer.json: .*(must be non-negative integers|wrong type)"),
    ({"step": True}, r"trainer.json: .*(must be non-negative integers|wrong type)"),
    ({"sequences": "12"}, r"trainer.json: .*(must be non-negative integers|wrong type)"),
    ({"elapsed_s": "x"}, r"trainer.json: .*(must be non-negative integers|wrong type)"),
    ({"last_val_loss": "low"}, r"trainer.json: .*(must be non-negative integers|wrong type)"),
    ({"threads": 2.5}, r"trainer.json: .*(must be non-negative integers|wrong type)"),
    ({"data": [1]}, r"trainer.json: .*(must be non-negative integers|wrong type)"),
    ({"extra": 3}, r"trainer.json: .*(must be non-negative integers|wrong type)"),
])
def test_a_damaged_trainer_state_is_refused(tmp_path: Path, change: dict, message: str) -> None:
    path = save(tmp_path, 1)
    rewrite_json(path / "trainer.json", **change)
    with pytest.raises(DamagedCheckpoint, match=message):
        read_checkpoint(path)


def test_a_trainer_state_reads_its_known_fields_and_ignores_others(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    rewrite_json(path / "trainer.json", threads=3, last_val_loss=2, future_field="x")
    state = read_checkpoint(path).state
    assert state.threads == 3 and state.last_val_loss == 2 and state.world_size == 1
    (path / "trainer.json").write_text("{")
    with pytest.raises(DamagedCheckpoint, match="trainer.json: not readable JSON"):
        read_checkpoint(path)
    (path / "trainer.json").write_text("[1]")
    with pytest.raises(DamagedCheckpoint, match="unknown format"):
        read_checkpoint(path)


#: JSON nested deeper than Python's parser recurses: json.loads raises RecursionError, not a JSONDecodeError.
TOO_DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("where", ["trainer.json", "tokenizer in the weights' header", "optimizer header"])
def test_json_nested_too_deeply_to_parse_is_a_damaged_checkpoint_and_resume_falls_back(tmp_path: Path,
                                                                                       where: str) -> None:
    from specformer_train.resume import find_resumable

    save(tmp_path, 1)
    path = save(tmp_path, 2)
    if where == "trainer.json":
        (path / "trainer.json").write_text(TOO_DEEP)
        message = r"trainer.json: not readable JSON \(nested too deeply to parse\)"
    elif where == "optimizer header":
        rewrite_optimizer(path / "optimizer.safetensors", metadata={"param_groups": TOO_DEEP})
        message = r"optimizer.safetensors: not a readable optimizer state \(RecursionError"
    else:
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            header, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        save_file(tensors, str(path / "model.safetensors"), {**header, METADATA_KEY: TOO_DEEP})
        message = rf"model.safetensors \({METADATA_KEY} in the header\): not readable JSON \(nested too deeply"
    with pytest.raises(DamagedCheckpoint, match=message):
        read_checkpoint(path)
    said: list[str] = []
    assert find_resumable(tmp_path, True, say=said.append).state.step == 1
    assert said[0].startswith("warning: cannot resume from step-0000002: ") and re.search(message, said[0])


def test_damaged_weights_are_a_damaged_checkpoint(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    (path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(DamagedCheckpoint, match="model.safetensors"):
        read_checkpoint(path)


def rewrite_optimizer(path: Path, *, metadata: dict[str, str] | None = None,
                      tensors: dict[str, torch.Tensor] | None = None) -> None:
    with safe_open(str(path), framework="pt") as f:
        old_meta = f.metadata()
        old_tensors = {name: f.get_tensor(name) for name in f.keys()}
    meta = {**old_meta, **(metadata or {})}
    save_file({**old_tensors, **(tensors or {})}, str(path), metadata={k: v for k, v in meta.items() if v is not None})


@pytest.mark.parametrize("metadata, message", [
    ({"param_groups": None}, "not a readable optimizer state"),
    ({"param_groups": "{"}, "not a readable optimizer state"),
    ({"param_groups": '{"params": []}'}, "param_groups must be a list of groups with their params"),
    ({"param_groups": "[1]"}, "param_groups must be a list of groups with their params"),
    ({"param_groups": '[{"params": 3}]'}, "param_groups must be a list of groups with their params"),
    ({"scalars": "[]"}, "the scalars are a list, expected a mapping"),
    # forged values that would otherwise reach torch.optim and fail deep inside it, or train on nonsense
    ({"scalars": '{"embedding.weight/note": "x"}'}, r"the state 'embedding.weight/note' is 'x', expected a number"),
    ({"scalars": '{"embedding.weight/note": true}'}, r"the state 'embedding.weight/note' is True, expected a number"),
    ({"scalars": '{"no.such.param/step": 1}'}, r"the state 'no.such.param/step' belongs to no parameter"),
    ({"scalars": '{"embedding.weight/exp_avg": 1}'}, r"the state 'embedding.weight/exp_avg' is stored both as a tensor and"),
    ({"param_groups": '[{"params": ["no.such.param"]}]'}, r"group 0's params must name stored parameters"),
    ({"param_groups": '[{"params": [], "lr": [[1]]}]'}, r"group 0's 'lr' is not a number, boolean, null, string"),
])
def test_a_damaged_optimizer_header_is_refused(tmp_path: Path, metadata: dict, message: str) -> None:
    path = save(tmp_path, 1)
    rewrite_optimizer(path / "optimizer.safetensors", metadata=metadata)
    with pytest.raises(DamagedCheckpoint, match=f"optimizer.safetensors: {message}"):
        read_checkpoint(path)


@pytest.mark.parametrize("slot, value, message", [
    ("embedding.weight/exp_avg", torch.zeros(3), "the state of 'embedding.weight' does not match the saved weights"),
    ("embedding.weight/exp_avg_sq", torch.zeros(3), "the state of 'embedding.weight' does not match the saved weights"),
    ("embedding.weight/momentum_buffer", torch.zeros(3), "the state of 'embedding.weight' does not match the saved"),
    ("embedding.weight/step", torch.zeros(2), r"\(step shaped \[2\], expected \[259, 16\] or \[\] for a count\)"),
    ("embedding.weight/step", torch.zeros((), dtype=torch.int64), "'embedding.weight/step' is int64, expected a floating"),
    ("no.such.param/exp_avg", torch.zeros(3), "the state 'no.such.param/exp_avg' belongs to no parameter"),
])
def test_optimizer_state_that_does_not_fit_the_saved_weights_is_refused(tmp_path: Path, slot: str,
                                                                        value: torch.Tensor, message: str) -> None:
    path = save(tmp_path, 1)
    rewrite_optimizer(path / "optimizer.safetensors", tensors={slot: value})
    with pytest.raises(DamagedCheckpoint, match=message):
        read_checkpoint(path)


@pytest.mark.parametrize("setting, value", [("lr", "x"), ("betas", [0.9]), ("amsgrad", 1), ("eps", None)])
def test_stored_group_settings_of_another_kind_than_the_optimizer_takes_are_refused(tmp_path: Path, setting: str,
                                                                                     value: Any) -> None:
    path = save(tmp_path, 1)
    with safe_open(str(path / "optimizer.safetensors"), framework="pt") as f:
        groups = json.loads(f.metadata()["param_groups"])
    groups[1][setting] = value
    rewrite_optimizer(path / "optimizer.safetensors", metadata={"param_groups": json.dumps(groups)})
    model, optimizer = trained()
    with pytest.raises(CheckpointError, match=rf"the stored optimizer settings are not of the kind AdamW takes "
                                              rf"\(group 1's {setting} is "):
        apply_checkpoint(read_checkpoint(path), model=model, optimizer=optimizer, tokenizer=ByteTokenizer())


def test_an_optimizer_header_from_before_the_class_and_scalars_were_recorded_reads_as_adamw(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    rewrite_optimizer(path / "optimizer.safetensors", metadata={"optimizer": None, "scalars": None})
    contents = read_checkpoint(path)
    assert contents.optimizer["optimizer"] == "AdamW"
    model, optimizer = trained()
    apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=ByteTokenizer())


def test_a_scalar_optimizer_entry_comes_back_as_saved(tmp_path: Path) -> None:
    model, optimizer = trained()
    next(iter(optimizer.state.values()))["note"] = 7  # a non-tensor entry, kept as JSON
    name = next(n for n, p in model.named_parameters() if "note" in optimizer.state[p])
    path = save(tmp_path, 1, model_and_optimizer=(model, optimizer))
    assert read_checkpoint(path).optimizer["state"][name]["note"] == 7


def test_another_optimizer_class_or_group_count_is_refused(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    model = specformer.build({"model": MODEL}, seed=0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match=r"trained with the optimizer AdamW, this spec's train.optimizer builds SGD"):
        apply_checkpoint(read_checkpoint(path), model=model, optimizer=sgd, tokenizer=ByteTokenizer())
    one_group = torch.optim.AdamW(model.parameters(), lr=0.1)
    with pytest.raises(CheckpointError, match=r"has 2 parameter groups, this spec's train.optimizer makes 1"):
        apply_checkpoint(read_checkpoint(path), model=model, optimizer=one_group, tokenizer=ByteTokenizer())


def test_weights_that_do_not_fit_the_model_are_listed(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    contents = read_checkpoint(path)
    contents.weights["extra.weight"] = torch.zeros(1)
    del contents.weights["final_norm.weight"]
    contents.weights["embedding.weight"] = torch.zeros(3, 16)
    model, optimizer = trained()
    with pytest.raises(CheckpointError) as info:
        apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=ByteTokenizer())
    assert ("(missing ['final_norm.weight'], unexpected ['extra.weight'], mis-shaped "
            "['embedding.weight (3, 16) vs (259, 16)']); resume with the spec") in str(info.value)


def test_another_tokenizer_is_refused_and_a_checkpoint_without_one_is_accepted(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    contents = read_checkpoint(path)

    class Other(ByteTokenizer):
        def to_json(self) -> str:
            return json.dumps({"kind": "other"})

    model, optimizer = trained()
    with pytest.raises(CheckpointError, match="trained with a different tokenizer"):
        apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=Other())
    untagged = CheckpointContents(path=path, state=contents.state, weights=contents.weights,
                                  optimizer=contents.optimizer, tokenizer_json=None, rng=None)
    apply_checkpoint(untagged, model=model, optimizer=optimizer, tokenizer=Other())


@pytest.mark.parametrize("damage", ["no torch state", "bad python json", "bad numpy state"])
def test_a_damaged_rng_file_is_refused_and_leaves_the_generators_alone(tmp_path: Path, damage: str) -> None:
    path = save(tmp_path, 1)
    rng = path / "rng-rank0.safetensors"
    with safe_open(str(rng), framework="pt") as f:
        meta, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    if damage == "no torch state":
        tensors = {"other": torch.zeros(1)}
    elif damage == "bad python json":
        meta["python"] = "[1, 2]"
    else:
        meta["numpy"] = json.dumps(["MT19937", [1, 2, 3], 0, 0, 0.0])
    save_file(tensors, str(rng), metadata=meta)
    torch.manual_seed(1)
    random.seed(1)
    before = (torch.get_rng_state(), random.getstate())
    with pytest.raises(DamagedCheckpoint, match="rng-rank0.safetensors: not a readable random-number-generator state") as info:
        read_checkpoint(path)
    if damage == "bad python json":
        assert "(ValueError: not enough values to unpack" in str(info.value)
    assert torch.equal(torch.get_rng_state(), before[0]) and random.getstate() == before[1]


# -- failures, plugins and the CUDA generator ---------------------------------------------------


def test_the_shape_message_says_none_for_what_is_not_wrong(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    contents = read_checkpoint(path)
    del contents.weights["final_norm.weight"]
    model, optimizer = trained()
    with pytest.raises(CheckpointError) as info:
        apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=ByteTokenizer())
    assert str(info.value).startswith(f"{path / 'model.safetensors'}: does not fit the model of this spec (missing "
                                      "['final_norm.weight'], unexpected none, mis-shaped none); ")
    contents = read_checkpoint(path)
    contents.weights["extra.weight"] = torch.zeros(1)
    with pytest.raises(CheckpointError, match=r"\(missing none, unexpected \['extra.weight'\], mis-shaped none\)"):
        apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=ByteTokenizer())


def test_the_optimizer_class_is_recorded_and_a_hand_made_state_without_it_is_adamw(tmp_path: Path) -> None:
    model = specformer.build({"model": MODEL}, seed=0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    sgd.step()
    path = save(tmp_path, 1, model_and_optimizer=(model, sgd))
    assert read_checkpoint(path).optimizer["optimizer"] == "SGD"
    contents = read_checkpoint(save(tmp_path / "adamw", 1))
    del contents.optimizer["optimizer"]
    other, optimizer = trained()
    apply_checkpoint(contents, model=other, optimizer=optimizer, tokenizer=ByteTokenizer())


def test_an_unreadable_optimizer_header_names_the_error(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    rewrite_optimizer(path / "optimizer.safetensors", metadata={"param_groups": "{"})
    with pytest.raises(DamagedCheckpoint, match=r"not a readable optimizer state \(JSONDecodeError: "):
        read_checkpoint(path)


def test_a_cuda_generator_state_is_read_back(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    rng = path / "rng-rank0.safetensors"
    with safe_open(str(rng), framework="pt") as f:
        meta, tensors = f.metadata(), {name: f.get_tensor(name) for name in f.keys()}
    cuda_state = torch.arange(16, dtype=torch.uint8)  # as a CUDA machine would have saved it
    save_file({**tensors, "torch_cuda": cuda_state}, str(rng), metadata=meta)
    assert torch.equal(read_checkpoint(path).rng["torch_cuda"], cuda_state)
    assert read_checkpoint(save(tmp_path / "cpu", 1)).rng["torch_cuda"] is None


@pytest.mark.parametrize("ctx", [
    ParallelLayout(rank=1, world_size=1),  # no rng-rank1 file: each process restores only its own states
    ParallelLayout(rank=0, world_size=2),  # saved by one process: not restored into two
], ids=["another-rank", "another-world-size"])
def test_generator_states_are_restored_only_by_the_process_that_saved_them(tmp_path: Path, ctx: ParallelLayout) -> None:
    from specformer_train.checkpointing import load_checkpoint

    torch.manual_seed(7)  # the state saved differs from the one checked below, whatever ran before
    path = save(tmp_path, 1)
    model, optimizer = trained()
    torch.manual_seed(42)
    before = torch.get_rng_state()
    load_checkpoint(path, model=model, optimizer=optimizer, tokenizer=ByteTokenizer(), ctx=ctx)
    assert torch.equal(torch.get_rng_state(), before)


def test_what_cannot_be_removed_does_not_fail_a_save_or_a_recovery(tmp_path: Path) -> None:
    root = fake_step_dirs(tmp_path, 5)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "step-0000001").symlink_to(elsewhere, target_is_directory=True)  # rmtree refuses symbolic links
    (root / ".step-0000003.tmp-1").symlink_to(elsewhere, target_is_directory=True)
    assert recover_interrupted_saves(tmp_path) == []
    prune(tmp_path, keep_last=1, keep=root / "step-0000005")
    assert (root / "step-0000001").is_symlink() and elsewhere.is_dir()


def test_a_save_that_cannot_even_start_reports_it(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").write_text("a file where the folder should be")
    with pytest.raises(OutputError, match=r"could not save checkpoint .*step-0000001: .*; no earlier checkpoint"):
        save(tmp_path, 1)


class SavedWeights:
    """A plugin storing the weights with a header entry of its own (as an adapter stores its part)."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    @hookimpl
    def specformer_train_saved_weights(self, model: Any, weights: dict, path: str) -> Any:
        assert hasattr(model, "spec") and weights.keys() == model.state_dict().keys()
        self.paths.append(path)
        return {name: t * 0 for name, t in weights.items()}, {"adapter_base": "base.safetensors", "train_step": "99"}


def test_a_plugin_chooses_the_stored_weights_and_adds_its_header_entries(tmp_path: Path) -> None:
    plugin = SavedWeights()
    manager = get_plugin_manager()
    manager.register(plugin, name="saved-weights-test")
    try:
        path = save(tmp_path, 4)
    finally:
        manager.unregister(plugin)
    assert plugin.paths == [str(path / "model.safetensors")]
    header = read_metadata(path / "model.safetensors")
    assert header["adapter_base"] == "base.safetensors" and header["train_step"] == "4"  # ours win
    assert all(not t.any() for t in read_checkpoint(path).weights.values())


def test_a_checkpoint_of_another_optimizer_is_refused_with_the_whole_reason(tmp_path: Path) -> None:
    model = specformer.build({"model": MODEL}, seed=0)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    path = save(tmp_path, 1, model_and_optimizer=(model, sgd))
    other, adamw = trained()
    with pytest.raises(CheckpointError) as info:
        apply_checkpoint(read_checkpoint(path), model=other, optimizer=adamw, tokenizer=ByteTokenizer())
    assert str(info.value) == (f"{path}: the run was trained with the optimizer SGD, this spec's train.optimizer builds "
                               "AdamW; resume with the optimizer the run was started with")
    one_group = torch.optim.AdamW(other.parameters(), lr=0.1)
    with pytest.raises(CheckpointError) as info:
        apply_checkpoint(read_checkpoint(save(tmp_path / "b", 1)), model=other, optimizer=one_group,
                         tokenizer=ByteTokenizer())
    assert str(info.value).endswith("the optimizer state has 2 parameter groups, this spec's train.optimizer makes 1; "
                                    "resume with the groups rules the run was started with")


def test_the_tokenizer_refusal_says_what_to_do(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    contents = read_checkpoint(path)
    contents.tokenizer_json = json.dumps({"kind": "other"})
    model, optimizer = trained()
    with pytest.raises(CheckpointError) as info:
        apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=ByteTokenizer())
    assert str(info.value) == (f"{path}: the checkpoint was trained with a different tokenizer than train.tokenizer "
                               "gives now; resume with the same tokenizer and data")


class ResumedWeights:
    """A plugin completing stored weights on resume (as an adapter completes its part from the base)."""

    def __init__(self) -> None:
        self.seen: list[tuple[Any, dict]] = []

    @hookimpl
    def specformer_train_resumed_weights(self, model: Any, weights: dict) -> Any:
        self.seen.append((model, weights))
        return {name: torch.full_like(t, 0.5) for name, t in model.state_dict().items()}


def test_a_plugin_completes_the_weights_on_resume(tmp_path: Path) -> None:
    contents = read_checkpoint(save(tmp_path, 1))
    model, optimizer = trained()
    plugin = ResumedWeights()
    manager = get_plugin_manager()
    manager.register(plugin, name="resumed-weights-test")
    try:
        apply_checkpoint(contents, model=model, optimizer=optimizer, tokenizer=ByteTokenizer())
    finally:
        manager.unregister(plugin)
    assert len(plugin.seen) == 1 and plugin.seen[0][0] is model and plugin.seen[0][1] is contents.weights
    assert all(bool((t == 0.5).all()) for t in model.state_dict().values())


def test_recovery_looks_past_entries_it_does_not_own(tmp_path: Path) -> None:
    root = fake_step_dirs(tmp_path)
    (root / "!first").mkdir(parents=True)  # sorts before the leftovers
    (root / ".step-0000002.tmp-1").mkdir()
    recover_interrupted_saves(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["!first"]


class FakeCuda:
    """torch.cuda as a machine with CUDA shows it to the RNG code: a generator state to save and restore."""

    def __init__(self) -> None:
        self.state = torch.arange(8, dtype=torch.uint8)
        self.set_to: list[torch.Tensor] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_rng_state", lambda: self.state)
        monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state: self.set_to.append(state))


def test_the_cuda_generator_state_is_saved_and_restored_where_there_is_cuda(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from specformer_train.checkpointing import _get_rng, _save_rng, _set_rng

    fake = FakeCuda()
    pair = trained()
    fake.install(monkeypatch)
    _save_rng(tmp_path / "rng.safetensors")
    with safe_open(str(tmp_path / "rng.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("torch_cuda"), fake.state)
    _set_rng({**_get_rng(), "torch_cuda": torch.ones(3, dtype=torch.uint8)})
    assert len(fake.set_to) == 1 and torch.equal(fake.set_to[0], torch.ones(3, dtype=torch.uint8))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    _save_rng(tmp_path / "unused.safetensors")  # CUDA there but never used: no state to save
    with safe_open(str(tmp_path / "unused.safetensors"), framework="pt") as f:
        assert set(f.keys()) == {"torch_cpu"}
    _set_rng(_get_rng())  # no CUDA state recorded: nothing to set
    assert len(fake.set_to) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _set_rng({**_get_rng(), "torch_cuda": torch.ones(3, dtype=torch.uint8)})  # a CUDA state where there is none
    assert len(fake.set_to) == 1
    assert pair  # (the model was built before torch.cuda was faked)


def test_a_trainer_state_without_a_format_tag_is_damaged(tmp_path: Path) -> None:
    path = save(tmp_path, 1)
    data = json.loads((path / "trainer.json").read_text())
    del data["format"]
    (path / "trainer.json").write_text(json.dumps(data))
    with pytest.raises(DamagedCheckpoint, match="unknown format"):
        read_checkpoint(path)


def test_temporary_names_carry_the_runs_tag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    renamed: list[str] = []
    replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renamed.append(Path(src).name), replace(src, dst))[1])
    model, optimizer = trained()
    save_checkpoint(out_dir=tmp_path, model=model, optimizer=optimizer, state=TrainerState(step=1),
                    tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=3, tag="run7")
    assert ".step-0000001.tmp-run7" in renamed
    renamed.clear()
    save(tmp_path, 2)
    untagged = [n for n in renamed if n.startswith(".step-0000002.tmp-")]
    assert len(untagged) == 1 and untagged[0] != ".step-0000002.tmp-None"


def test_a_step_saved_again_after_a_resume_is_not_pruned_though_newer_ones_exist(tmp_path: Path) -> None:
    pair = trained()
    for step in (5, 6, 1):  # step 1 again: resumed from it, newer checkpoints still on disk
        save(tmp_path, step, keep_last=2, model_and_optimizer=pair)
    assert [s for s, _ in step_dirs(tmp_path)] == [1, 5, 6]  # the oldest by number is the one just saved
    assert latest_checkpoint(tmp_path) == checkpoint_root(tmp_path) / "step-0000001"
