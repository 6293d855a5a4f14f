"""A run's ``step-N`` directory and the run directory itself are checkpoints every command reads
(:func:`specformer.checkpoint.locate.resolve_checkpoint`), and Ctrl-C prints a command that works."""

from __future__ import annotations

import os
import shlex
import signal
import shutil
from pathlib import Path

import pytest
import yaml

from specformer.cli.main import main
from specformer.registry.discovery import get_plugin_manager
from specformer.registry.hookspecs import hookimpl

from .conftest import tiny_train_spec

pytest.importorskip("specformer_generate")


class CtrlCAt:
    """Sends this process the Ctrl-C signal after one training step, as a user at the terminal would."""

    def __init__(self, step: int) -> None:
        self.step = step

    @hookimpl
    def specformer_on_train_step(self, step: int, metrics: dict) -> None:
        if step == self.step:
            os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture
def interrupted_run(tmp_path: Path, corpus_dir: Path, capsys: pytest.CaptureFixture) -> tuple[Path, str]:
    """A run stopped by Ctrl-C at step 3 of 8 (a checkpoint at step 2 beside the one the interrupt saves), and what
    it printed on stderr."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_train_spec(data=str(corpus_dir), eval_every=0, save_every=2,
                                                   sample_prompt="the ")))
    out = tmp_path / "run dir"  # a space: the printed command must quote it
    plugin = CtrlCAt(3)
    get_plugin_manager().register(plugin, name="ctrl-c-at")
    try:
        assert main(["train", str(spec), "--out", str(out)]) == 130
    finally:
        get_plugin_manager().unregister(plugin)
    return out, capsys.readouterr().err


def test_the_interrupt_message_prints_a_command_that_works(interrupted_run, capsys: pytest.CaptureFixture) -> None:
    out, err = interrupted_run
    assert f"interrupted at step 3; saved {out / 'checkpoints' / 'step-0000003'}" in err
    assert not (out / "model.safetensors").exists()  # no final model: only the checkpoints
    line = next(l for l in err.splitlines() if l.startswith("try:"))
    words = shlex.split(line.removeprefix("try:"))  # what a POSIX shell passes on
    assert words[:2] == ["specformer", "generate"] and words[2] == str(out)
    assert main(words[1:]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.startswith("the ")


def test_generate_reads_a_step_directory_and_a_run_directory(interrupted_run, capsys: pytest.CaptureFixture) -> None:
    out, _ = interrupted_run
    step = out / "checkpoints" / "step-0000002"
    for checkpoint in (step, out, step / "model.safetensors"):
        assert main(["generate", str(checkpoint), "--prompt", "the ", "--max-new-tokens", "4", "--seed", "1"]) == 0, \
            capsys.readouterr().err
    outputs = capsys.readouterr().out.splitlines()
    assert outputs[0] == outputs[2]  # the step directory is its model.safetensors
    assert main(["summary", str(out)]) == 0  # summary reads a checkpoint's spec, from a directory too
    assert "weights in the file:" in capsys.readouterr().out


def test_the_run_directory_is_the_checkpoint_latest_names(interrupted_run) -> None:
    from specformer.checkpoint.locate import resolve_checkpoint

    out, _ = interrupted_run
    root = out / "checkpoints"
    assert resolve_checkpoint(out) == root / "step-0000003" / "model.safetensors"
    (root / "latest").write_text("step-0000002")  # a resume went back to step 2: step 3 is an abandoned timeline
    assert resolve_checkpoint(out) == root / "step-0000002" / "model.safetensors"
    (root / "latest").unlink()  # without latest: the newest checkpoint
    assert resolve_checkpoint(out) == root / "step-0000003" / "model.safetensors"


@pytest.mark.parametrize("command", [["generate", "{}", "--prompt", "a"], ["summary", "{}"], ["hf", "export", "{}", "{out}"],
                                     ["eval", "{}", "--data", "{out}"], ["quantize", "{}", "--method", "int8", "-o", "{out}.safetensors"]])
def test_a_directory_without_a_checkpoint_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             command: list[str]) -> None:
    empty, run = tmp_path / "empty", tmp_path / "run"
    empty.mkdir()
    (run / "checkpoints").mkdir(parents=True)  # a run that never saved
    for given, expected in ((empty, f"error: {empty}: a directory without a checkpoint (no model.safetensors, no "
                                    "checkpoints/); give a .safetensors checkpoint, a run's checkpoints/step-N "
                                    "directory, or a run directory"),
                            (run, f"error: {run}: a run directory without a checkpoint yet (no step-N directory in "
                                  f"{run / 'checkpoints'}); give a .safetensors checkpoint")):
        args = [word.format(given, out=tmp_path / "o") for word in command]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith(expected) and err.count("\n") == 1, err


def test_a_sharded_step_directory_names_the_command_that_consolidates_it(interrupted_run,
                                                                         capsys: pytest.CaptureFixture) -> None:
    out, _ = interrupted_run
    step = out / "checkpoints" / "step-0000003"
    weights = step / "model.safetensors"
    os.replace(weights, out / "kept.safetensors")
    (step / "sharded.json").write_text("{}")  # what marks a sharded checkpoint (its shards are not needed to say so)
    for given in (step, out):
        assert main(["generate", str(given), "--prompt", "a"]) == 2
        err = capsys.readouterr().err
        assert err == (f"error: {step}: a sharded training checkpoint; write its single file with "
                       f"`specformer checkpoint consolidate {shlex.quote(str(step))}` and give that\n")
    os.replace(out / "kept.safetensors", weights)  # consolidated in place (what the command writes): read as it is
    assert main(["generate", str(out), "--prompt", "a", "--max-new-tokens", "2"]) == 0
    shutil.rmtree(out)


def test_train_init_starts_from_a_run_directory(interrupted_run, capsys: pytest.CaptureFixture) -> None:
    out, _ = interrupted_run
    spec = out.parent / "spec.yaml"
    assert main(["train", str(spec), "--init", str(out), "--out", str(out.parent / "tuned"), "--steps", "1",
                 "--set", "train.save_every=0"]) == 0, capsys.readouterr().err
    assert main(["train", str(spec), "--init", str(out.parent), "--out", str(out.parent / "again"), "--steps", "1"]) == 2
    assert f"error: train.init: {out.parent}: a directory without a checkpoint" in capsys.readouterr().err
