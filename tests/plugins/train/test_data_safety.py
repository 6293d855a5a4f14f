"""No run is lost: saving replaces a checkpoint only once the new one is in place, --resume falls back
past damaged checkpoints naming the bad file, and output failures stop a run with one clear line."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import specformer
from specformer.cli.main import main
from specformer_train import checkpointing, rundir, train
from specformer.files.atomic import temp_sibling
from specformer_train.checkpointing import latest_checkpoint, recover_interrupted_saves
from specformer_train.metrics import read_metrics

from .conftest import tiny_train_spec


class Killed(BaseException):
    """Stands for the process dying: no handler of the code under test catches it."""


def spec(corpus: Path, out: Path, **train_settings: Any) -> dict[str, Any]:
    return tiny_train_spec(data=str(corpus), out_dir=str(out), **{"steps": 8, "save_every": 4, "eval_every": 4,
                                                                  **train_settings})


def losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]


@pytest.fixture
def finished(tmp_path: Path, corpus_dir: Path) -> tuple[Path, list[tuple[int, float]]]:
    """A run of 8 steps with checkpoints at 4 and 8 (latest: 8), and its loss curve."""
    out = tmp_path / "run"
    train(spec(corpus_dir, out))
    return out, losses(out)


# -- replacing a checkpoint --------------------------------------------------------------


def test_a_crash_while_a_step_is_saved_again_keeps_the_old_copy_and_resume_uses_it(
        finished, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    out, curve = finished
    root = out / "checkpoints"
    step8_model = (root / "step-0000008" / "model.safetensors").read_bytes()
    real_replace = os.replace

    def dying_replace(src: Any, dst: Any) -> None:
        # The moment of the issue: the old step-8 has been moved aside, the new one is not yet in place.
        if Path(src).name.startswith(".step-0000008.tmp-"):
            raise Killed
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", dying_replace)
    with pytest.raises(Killed):
        train(spec(corpus_dir, out), resume=str(root / "step-0000004"))  # saves step 8 again
    monkeypatch.setattr(os, "replace", real_replace)
    assert not (root / "step-0000008").exists() and (root / "latest").read_text() == "step-0000008"
    aside = list(root.glob(".step-0000008.old-*"))
    assert len(aside) == 1 and (aside[0] / "model.safetensors").read_bytes() == step8_model

    # The next run (even a fresh start, which is then refused) puts the old copy back; nothing is deleted.
    capsys.readouterr()
    with pytest.raises(specformer.UserError, match="holds an earlier run"):
        train(spec(corpus_dir, out))
    assert f"restored {root / 'step-0000008'}, which an interrupted save had moved aside" in capsys.readouterr().out
    assert (root / "step-0000008" / "model.safetensors").read_bytes() == step8_model
    result = train(spec(corpus_dir, out, steps=10), resume=True)
    assert "(resuming step-0000008)" in capsys.readouterr().out and result.step == 10
    assert not list(root.glob(".step-*")), "the unfinished temporaries are cleaned up"
    assert losses(out)[:8] == curve


def test_saving_the_same_step_again_replaces_it_whole(finished, corpus_dir: Path) -> None:
    out, curve = finished
    root = out / "checkpoints"
    train(spec(corpus_dir, out), resume=str(root / "step-0000004"))
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-0000004", "step-0000008"]
    assert (root / "latest").read_text() == "step-0000008" and losses(out) == curve


def test_temporary_names_are_unique_per_process_and_call(tmp_path: Path) -> None:
    a, b = temp_sibling(tmp_path / "model.safetensors"), temp_sibling(tmp_path / "model.safetensors")
    assert a != b and a.name.startswith(f".model.safetensors.tmp-{os.getpid()}-")


def test_recovery_removes_unfinished_saves_and_superseded_copies_only(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for name in ("step-0000004", ".step-0000004.old-1-aa", ".step-0000006.tmp-1-bb", ".step-0000008.old-2-cc"):
        (root / name).mkdir(parents=True)
        (root / name / "trainer.json").write_text(name)
    notes = recover_interrupted_saves(tmp_path)
    assert sorted(p.name for p in root.iterdir()) == ["step-0000004", "step-0000008"]
    assert (root / "step-0000004" / "trainer.json").read_text() == "step-0000004", "the complete copy wins"
    assert (root / "step-0000008" / "trainer.json").read_text() == ".step-0000008.old-2-cc"
    assert notes == [f"restored {root / 'step-0000008'}, which an interrupted save had moved aside"]


# -- resuming past damaged checkpoints ---------------------------------------------------


def damage(path: Path, how: str) -> None:
    if how == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "garbage":
        path.write_bytes(b"\x00garbage" * 10)
    else:
        path.unlink()


@pytest.mark.parametrize("file, how", [
    ("optimizer.safetensors", "truncated"),
    ("trainer.json", "garbage"),
    ("rng-rank0.safetensors", "garbage"),
    ("model.safetensors", "truncated"),
    ("optimizer.safetensors", "missing"),
])
def test_resume_falls_back_to_the_newest_intact_checkpoint_naming_the_bad_file(
        finished, corpus_dir: Path, capsys: pytest.CaptureFixture, file: str, how: str) -> None:
    out, curve = finished
    bad = out / "checkpoints" / "step-0000008" / file
    damage(bad, how)
    capsys.readouterr()
    result = train(spec(corpus_dir, out), resume=True)
    printed = capsys.readouterr().out
    assert f"warning: cannot resume from step-0000008: {bad if how != 'missing' else bad.parent}" in printed
    assert "note: resuming from step-0000004, the newest intact checkpoint" in printed
    assert result.step == 8 and losses(out) == curve, "the run continues exactly from step 4"


def test_resume_falls_back_when_latest_names_a_missing_checkpoint(finished, corpus_dir: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    out, curve = finished
    shutil.rmtree(out / "checkpoints" / "step-0000008")
    capsys.readouterr()
    train(spec(corpus_dir, out), resume=True)
    printed = capsys.readouterr().out
    assert "cannot resume from step-0000008" in printed and "no such checkpoint directory" in printed
    assert "resuming from step-0000004" in printed and losses(out) == curve


def test_a_named_damaged_checkpoint_and_a_run_with_none_intact_are_clear_errors(
        finished, corpus_dir: Path, capsys: pytest.CaptureFixture) -> None:
    out, _ = finished
    root = out / "checkpoints"
    damage(root / "step-0000008" / "trainer.json", "garbage")
    spec_path = out.parent / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec(corpus_dir, out)))
    code = main(["train", str(spec_path), "--resume", str(root / "step-0000008")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"the checkpoint is damaged: {root / 'step-0000008' / 'trainer.json'}: not readable JSON" in err
    damage(root / "step-0000004" / "rng-rank0.safetensors", "truncated")
    code = main(["train", str(spec_path), "--resume"])
    err = capsys.readouterr().err
    assert code == 2 and "no intact checkpoint" in err and "rng-rank0.safetensors" in err and "--overwrite" in err


# -- output failures -------------------------------------------------------------------


def test_a_disk_too_small_for_the_checkpoints_is_refused_before_tokenizing(
        tmp_path: Path, spec_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        _private_cache: Path) -> None:
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    code = main(["train", str(spec_file), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "has 1000 B free, but 3 checkpoints and the final model of" in err and "train.keep_last" in err
    assert not list(_private_cache.rglob("*.bin")), "nothing was tokenized"


def test_a_disk_full_during_a_save_stops_with_one_line_and_keeps_the_last_checkpoint(
        tmp_path: Path, spec_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    real = checkpointing._save_optimizer
    calls = []

    def full_disk(state: Any, path: Path, **kwargs: Any) -> None:
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(state, path, **kwargs)

    monkeypatch.setattr(checkpointing, "_save_optimizer", full_disk)
    out = tmp_path / "out"
    code = main(["train", str(spec_file), "--out", str(out)])  # saves at steps 4 and 8
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert (f"could not save checkpoint {out / 'checkpoints' / 'step-0000008'}: No space left on device; "
            f"the latest checkpoint is still {out / 'checkpoints' / 'step-0000004'}") in err
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-0000004"]
    assert latest_checkpoint(out).name == "step-0000004" and not (out / "run.lock").exists()


def test_a_failed_final_export_leaves_the_earlier_model_file_whole(
        finished, corpus_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out, _ = finished
    before = (out / "model.safetensors").read_bytes()
    from specformer_train import trainer

    def failing_copy(source: Path, path: Path) -> None:
        with open(temp_sibling(path), "wb") as f:
            f.write(b"partial")
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(trainer, "copy_file_atomic", failing_copy)
    with pytest.raises(specformer.UserError, match=r"could not write .*model.safetensors: Read-only file system; "
                                                   r"the final weights are in .*step-0000010"):
        train(spec(corpus_dir, out, steps=10), resume=True)
    assert (out / "model.safetensors").read_bytes() == before


# -- Ctrl-C during start-up ---------------------------------------------------------------

# Sends this process SIGINT while the corpus is being looked for, before training starts.
INTERRUPT_AT_START = r"""
import os, signal, sys
import specformer_train.run as run
original = run.find_corpus
def interrupted(data, **settings):
    os.kill(os.getpid(), signal.SIGINT)
    return original(data, **settings)
run.find_corpus = interrupted
from specformer.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_during_start_up_exits_130_with_one_line(tmp_path: Path, spec_file: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture) -> None:
    from specformer_train import run

    def interrupted(data: Any, **settings: Any) -> None:
        raise KeyboardInterrupt  # what Python raises on SIGINT; the real signal: the slow test below

    monkeypatch.setattr(run, "find_corpus", interrupted)
    out = tmp_path / "out"
    assert main(["train", str(spec_file), "--out", str(out)]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "interrupted; the run directory keeps its last complete checkpoint, if any"
    assert not (out / "run.lock").exists()


@pytest.mark.slow
def test_ctrl_c_during_start_up_exits_130_without_a_traceback_and_releases_the_lock(
        tmp_path: Path, spec_file: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SPECFORMER_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", INTERRUPT_AT_START, "train", str(spec_file), "--out", str(out)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr and "interrupted" in done.stderr
    assert not (out / "run.lock").exists() and not (out / "checkpoints" / "latest").exists()


def test_a_token_cache_that_cannot_be_written_is_one_clear_line(tmp_path: Path, spec_file: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture,
                                                                _private_cache: Path) -> None:
    from specformer_text import cache

    def full_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache, "encoded_documents", full_disk)
    assert main(["train", str(spec_file), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"could not write the token cache in {_private_cache / 'tokens'}: No space left on device" in err
    assert not [p for p in (_private_cache / "tokens").iterdir()], "no partial entry is left"


def test_a_trained_tokenizer_that_cannot_be_cached_is_a_clear_error(corpus_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from specformer_text import tokenization
    from specformer_text.corpus import find_corpus

    def read_only(path: Path, text: str) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tokenization, "write_text_atomic", read_only)
    with pytest.raises(specformer.UserError, match=r"could not write the trained tokenizer to .*bpe-300-.*\.json: "
                                                   r"Read-only file system; .*train.cache_dir"):
        tokenization.make_tokenizer("bpe", vocab_size=300, corpus=find_corpus(str(corpus_dir)))
