"""Every command the project prints works: README.md, docs/*.md, ``--help`` epilogs and printed hints.

The commands are collected and classified by ``printed_commands`` (run with small step
counts, or skipped for a stated reason: see ``SKIPPED``), then run once per session in a
fresh interpreter, each source in its own workspace with the inputs its page assumes. One
test per printed command checks its exit code (and, for a ``console`` block that shows
output, that the output shown is what it prints); a hint a command prints (``try:
specformer generate ...``) runs right after it and must succeed too.
"""

from __future__ import annotations

import pytest

import printed_commands as pc

PRINTED = pc.collect()


@pytest.fixture(scope="session")
def results(tmp_path_factory, tutorial_staged) -> dict[str, dict]:
    """Every runnable printed command's result, by command id (hints under ``hint: ...``).

    The runs usually started in the background when the tests were collected
    (tests/docs/conftest.py), beside the tests before these; otherwise they start here.
    """
    if pc.started is None:
        pc.started = pc.Runs(PRINTED, tmp_path_factory.mktemp("printed"), {"tutorial": tutorial_staged})
    return pc.started.results()


@pytest.mark.parametrize("command", PRINTED, ids=[c.id for c in PRINTED])
def test_printed_command_works(command: pc.Printed, results):
    reason = pc.skip_reason(command.text)
    if reason:
        pytest.skip(reason)
    pc.argv_for(command.text)  # a command the runner cannot run and no rule skips fails here, saying so
    pc.check(command, results[command.id])


def test_every_printed_hint_works(results):
    hints = [r for r in results.values() if r["hint_of"]]
    assert any(r["argv"][:1] == ["generate"] for r in hints), "`specformer train` should end with a `try:` hint"
    failed = pc.failed_hints(results)
    assert not failed, "\n\n".join(failed)


def test_the_commands_are_found_where_they_are_printed():
    """The collector itself: a change to how pages are written must not make it find nothing."""
    by_source = {c.source.split(":")[0]: [] for c in PRINTED}
    for c in PRINTED:
        by_source[c.source.split(":")[0]].append(c.text)
    assert "specformer validate specs/tiny.yaml" in by_source["README.md"]
    assert "specformer schema > spec.schema.json" in by_source["README.md"]  # comment stripped, redirect kept
    assert any(t.startswith("specformer generate runs/tiny/model.safetensors --prompt") and "--stream" in t
               for t in by_source["README.md"])  # a continuation line joined
    assert "specformer train specs/tiny.yaml --resume" in by_source["specformer train --help"]
    exported = next(c for c in PRINTED if c.text == "specformer hf export alibi.safetensors out")
    assert exported.expected_code == 2 and exported.shown_output  # `echo $?` read, output lines kept
    assert not any(c.text.startswith(("$", "echo")) for c in PRINTED)


def test_every_printed_command_is_run_or_skipped_for_a_reason():
    for command in PRINTED:
        if pc.skip_reason(command.text) is None:
            pc.argv_for(command.text)  # raises for a command the runner cannot run and no rule skips


def test_training_commands_get_small_step_counts():
    argv, _ = pc.argv_for("specformer train specs/tiny.yaml --data notes/ --steps 500 --set train.lr=3e-4")
    assert argv[:6] == ["train", "specs/tiny.yaml", "--data", "notes/", "--set", "train.lr=3e-4"]
    assert argv[argv.index("--steps") + 1] == "2" and "500" not in argv
    resumed, _ = pc.argv_for("specformer train specs/tiny.yaml --resume")
    assert resumed[resumed.index("--steps") + 1] == "4"
    with pytest.raises(ValueError, match="add a rule to SKIPPED"):
        pc.argv_for("rm -rf runs")
    with pytest.raises(ValueError, match="shell syntax"):
        pc.argv_for("specformer validate specs/tiny.yaml && echo ok")


def test_inputs_are_made_only_for_what_a_command_reads(tmp_path):
    pc.make_inputs(["hf", "import", "./tiny-llama", "llama.safetensors"], tmp_path)
    assert (tmp_path / "tiny-llama" / "config.json").is_file()
    assert not (tmp_path / "llama.safetensors").exists()  # what the command writes is left to it
    pc.make_inputs(["eval", "llama.safetensors", "--data", "notes.txt"], tmp_path)
    assert (tmp_path / "llama.safetensors").is_file() and (tmp_path / "notes.txt").is_file()
