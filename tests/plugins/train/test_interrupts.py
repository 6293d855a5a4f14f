"""Killed and interrupted runs, in real subprocesses: SIGKILL mid-training or mid-save, then --resume,
gives the loss curve of the uninterrupted run step for step; Ctrl-C saves and exits cleanly."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specformer_train.metrics import read_metrics

from .conftest import make_text, tiny_train_spec

# Runs the real CLI with one extra plugin that sends this process a signal at a chosen moment.
DRIVER = r"""
import os, signal, sys
from specformer.registry.hookspecs import hookimpl
from specformer.registry.discovery import get_plugin_manager
from specformer.cli.main import main

mode, at, sig = os.environ.get("KILL_MODE", ""), int(os.environ.get("KILL_AT", "0")), os.environ.get("KILL_SIGNAL")

class Killer:
    @hookimpl
    def specformer_on_train_step(self, step, metrics):
        if mode == "step" and step == at:
            os.kill(os.getpid(), getattr(signal, sig))

if mode == "save":
    # Die while the checkpoint of step `at` is half written (its trainer.json is the first file we replace).
    import specformer_train.checkpointing as checkpointing
    original = checkpointing.write_text_atomic
    def dying(path, text):
        if path.name == "trainer.json" and f'"step": {at},' in text:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(path, text)
    checkpointing.write_text_atomic = dying

get_plugin_manager().register(Killer(), name="killer")
sys.exit(main(sys.argv[1:]))
"""

STEPS = 12


def cli(spec: Path, out: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "SPECFORMER_CACHE": str(spec.parent / "cache"), **(env or {})}
    return subprocess.run([sys.executable, "-c", DRIVER, "train", str(spec), "--out", str(out), *extra],
                          capture_output=True, text=True, env=full_env, timeout=300)


def curve(out: Path) -> list[tuple[str, int, float]]:
    return [(r["kind"], r["step"], r.get("loss", r.get("val_loss"))) for r in read_metrics(out / "metrics.jsonl")]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list]:
    root = tmp_path_factory.mktemp("interrupts")
    corpus = root / "corpus.txt"
    corpus.write_text(make_text(6000, seed=1))
    spec = root / "spec.yaml"
    data = tiny_train_spec(data=str(corpus), steps=STEPS, save_every=4, eval_every=4)
    data["model"]["block"]["ffn"]["dropout"] = 0.1  # so the resumed RNG state matters too
    spec.write_text(yaml.safe_dump(data))
    done = cli(spec, root / "uninterrupted")
    assert done.returncode == 0, done.stderr
    return root, spec, curve(root / "uninterrupted")


@pytest.mark.slow  # a training subprocess killed and resumed (11 s)
@pytest.mark.parametrize("mode, at", [("step", 6), ("save", 8)])
def test_sigkill_then_resume_matches_the_uninterrupted_run(setup, mode: str, at: int) -> None:
    root, spec, expected = setup
    out = root / f"killed-{mode}"
    killed = cli(spec, out, env={"KILL_MODE": mode, "KILL_AT": str(at), "KILL_SIGNAL": "SIGKILL"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    last_good = "step-0000004"
    assert (out / "checkpoints" / "latest").read_text() == last_good
    if mode == "save":
        assert len(list((out / "checkpoints").glob(".step-0000008.tmp-*"))) == 1, "the kill left a half-written one"
        assert not (out / "checkpoints" / "step-0000008").exists()
    assert max(step for _, step, _ in curve(out)) >= at - 1

    resumed = cli(spec, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {last_good}" in resumed.stdout
    assert curve(out) == expected  # every loss, every validation loss, exactly
    assert not list((out / "checkpoints").glob(".step-*"))


@pytest.mark.slow  # a subprocess run of many seconds; CI runs it in the slow suite
def test_ctrl_c_saves_exits_cleanly_and_resumes_exactly(setup) -> None:
    root, spec, expected = setup
    out = root / "ctrl-c"
    stopped = cli(spec, out, env={"KILL_MODE": "step", "KILL_AT": "5", "KILL_SIGNAL": "SIGINT"})
    assert stopped.returncode == 130, stopped.stderr
    assert "interrupted at step 5" in stopped.stderr and "--resume" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert (out / "checkpoints" / "latest").read_text() == "step-0000005"
    resumed = cli(spec, out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert curve(out) == expected
