"""`specformer train` on the command line: a run, and every kind of bad input exiting 2 with one message."""

from __future__ import annotations

import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml

from specformer.cli.main import main

from .conftest import tiny_train_spec


def test_train_command_runs_and_says_where_the_model_is(spec_file: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    code = main(["train", str(spec_file), "--out", str(out), "--steps", "3", "--set", "train.lr=2e-3",
                 "--set", "train.eval_every=0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "specformer train -> " in captured.out and "3 steps" in captured.out
    assert f"model: {out / 'model.safetensors'}" in captured.out
    assert "specformer generate" in captured.out
    assert (out / "checkpoints" / "step-0000003" / "model.safetensors").is_file()


def test_the_train_section_validates_with_specformer_validate(spec_file: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["validate", str(spec_file)]) == 0
    bad = spec_file.with_name("bad.yaml")
    bad.write_text(yaml.safe_dump(tiny_train_spec(steps=0)))
    assert main(["validate", str(bad)]) == 2
    assert "train.steps: Input should be greater than 0" in capsys.readouterr().err


def _tiny_corpus(tmp_path: Path) -> str:
    (tmp_path / "small.txt").write_text("just a few words\n")
    return str(tmp_path / "small.txt")


def _vocab_300(tmp_path: Path) -> list[str]:
    return ["--set", "model.vocab_size=300"]


@pytest.mark.parametrize("extra, needle", [
    (lambda d: ["--data", str(d / "nope")], "no such file or directory"),
    (lambda d: ["--set", "train.lrr=1"], "train.lrr: unknown field"),
    (lambda d: ["--set", "train.lr"], "expected KEY=VALUE"),
    (lambda d: ["--set", "train.batch_size=0"], "train.batch_size: Input should be greater than 0"),
    (lambda d: ["--data", _tiny_corpus(d)], "is shorter than one row of 33 tokens"),
    (lambda d: ["--data", _tiny_corpus(d), "--set", "train.val_fraction=0"], "fewer than one global batch"),
    (_vocab_300, "has 259 tokens but model.vocab_size is 300"),
    (lambda d: ["--resume"], "has no checkpoint to resume from"),
    (lambda d: ["--set", "train.device=gpu0"], "train.device 'gpu0' is not a device; accepted: auto, cpu"),
    (lambda d: ["--set", "train.distributed=ddp"], "needs a launch by torchrun"),
    (lambda d: ["--set", "train.lr=1e308"], "train.lr: Input should be less than or equal to 10"),
    (lambda d: ["--set", "train.lr=.inf"], "train.lr: Input should be a finite number"),
    (lambda d: ["--set", "train.grad_clip=.nan"], "train.grad_clip: Input should be a finite number"),
    (lambda d: ["--set", "train.steps=true"], "train.steps: a boolean is not a number here"),
    (lambda d: ["--set", "train.lr=true"], "train.lr: a boolean is not a number here"),
    (lambda d: ["--set", "train.threads=0"], "train.threads: must be auto or a thread count from 1 to 1024"),
    (lambda d: ["--new-data"], "--new-data only applies with --resume"),
])
def test_bad_input_exits_2_with_one_clear_message(spec_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  extra, needle: str) -> None:
    code = main(["train", str(spec_file), "--out", str(tmp_path / "out"), *extra(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err and "Traceback" not in err


def test_a_tokenized_array_trains(tmp_path: Path, spec_file: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(0)
    np.save(tmp_path / "ids.npy", rng.integers(0, 259, size=5000, dtype=np.int64))
    code = main(["train", str(spec_file), "--data", str(tmp_path / "ids.npy"), "--out", str(tmp_path / "o"),
                 "--steps", "2"])
    assert code == 0, capsys.readouterr().err


def test_an_occupied_run_directory_says_how_to_go_on(spec_file: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    assert main(["train", str(spec_file), "--out", str(out), "--steps", "2", "--set", "train.eval_every=0"]) == 0
    capsys.readouterr()
    assert main(["train", str(spec_file), "--out", str(out), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {out} holds an earlier run (step-0000002, model.safetensors); continue it with "
                          "--resume, replace it with --overwrite, or train into another directory with --out DIR")
    with pytest.raises(SystemExit) as exited:  # argparse's own exit for conflicting flags
        main(["train", str(spec_file), "--out", str(out), "--resume", "--overwrite"])
    assert exited.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    assert main(["train", str(spec_file), "--out", str(out), "--steps", "3", "--overwrite",
                 "--set", "train.eval_every=0"]) == 0
    assert "removed 1 checkpoint(s) of the earlier run" in capsys.readouterr().out


def test_the_printed_generate_command_works(tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("specformer_generate")
    prompt = "it's \"the\" $HOME "  # quotes and a dollar: it must reach generate as written
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_train_spec(data=str(corpus_dir), sample_prompt=prompt, eval_every=0)))
    out = tmp_path / "out dir"  # a space too
    assert main(["train", str(spec), "--out", str(out), "--steps", "2"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("try:"))
    command = line.removeprefix("try:").strip()
    assert shlex.split(command)[shlex.split(command).index("--prompt") + 1] == prompt
    new_tokens = int(shlex.split(command)[-1])
    assert new_tokens + len(prompt.encode()) <= 32  # the tiny model's context
    words = shlex.split(command)  # what a POSIX shell passes on
    assert words[0] == "specformer"
    assert main(words[1:]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith(prompt)
