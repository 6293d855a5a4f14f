"""Property-based: any argument vector ends in exit 0 or 2, never a traceback, a hang or a stray file.

Argument vectors are built from the real parsers (``specformer.cli.main.make_parser``, every
plugin's options included), so a new option is fuzzed as soon as it exists: a command
(``validate``, ``summary``, ``generate``, ``components``, ``schema``, ``hf import``,
``hf export``, ``hf attach-tokenizer``, ``hf families``, ``train``), some of its
positionals and options in any order, each given a value from a pool that fits its
kind (integers from 0 to 2^63 and text that is not a number for ``type=int``, infinities
and NaN for ``type=float``, every choice and a wrong one, paths that are valid, missing,
a directory, garbage, nested in a missing folder, or the repository's own files), and
sometimes an unknown flag or a stray word. ``train`` always ends with ``--steps 0`` or
``--steps 1`` and reads a small corpus, so each case stays quick.

Options left out, with the reason: ``--compile`` (torch.compile takes tens of seconds
per case; it is covered by the generate plugin's own tests).

Cases run in-process through ``specformer.cli.main`` with stdin empty (``harness``); a
handful run in a child process whose address space is capped (RLIMIT_AS), the inputs
that used to hang or exhaust memory.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, example, given
from hypothesis import strategies as st

import specformer
from specformer.cli.main import make_parser

from fixtures.tiny import tiny_spec
from fuzz.harness import FAST, PREFIX, SLOW, case_dir, run_cli, run_cli_subprocess, sentinel

COMMANDS = [("validate",), ("summary",), ("generate",), ("components",), ("schema",), ("hf", "import"),
            ("hf", "export"), ("hf", "attach-tokenizer"), ("hf", "families"), ("train",)]
LEFT_OUT = {"--compile"}
#: The tiny spec with room for the byte tokenizer's 259 ids, so that training and generating can succeed.
SPEC = tiny_spec(vocab_size=259)


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[name]
    raise KeyError(name)


def options_of(path: tuple[str, ...]) -> list[argparse.Action]:
    parser, _ = make_parser()
    for name in path:
        parser = _subparser(parser, name)
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))
            and not set(a.option_strings) & LEFT_OUT]


ACTIONS = {path: options_of(path) for path in COMMANDS}

# Files every case finds in its working directory (made by _populate), and names of things that are not there.
PATHS = [f"{PREFIX}tiny.yaml", f"{PREFIX}tiny.safetensors", f"{PREFIX}hf", f"{PREFIX}tokenizer.json",
         f"{PREFIX}corpus.txt", f"{PREFIX}garbage.safetensors", f"{PREFIX}empty", f"{PREFIX}bad.yaml",
         f"{PREFIX}missing.yaml", f"{PREFIX}missing/out.safetensors", f"{PREFIX}out.safetensors", f"{PREFIX}out",
         f"{PREFIX}out.json", f"{PREFIX}tiny.safetensors/x", "-", "", ".", "/dev/null", "/", "\udce9.yaml"]
INTS = st.one_of(st.integers(-3, 4).map(str), st.sampled_from(["0", "1", str(2**31), str(2**53 + 1), str(2**63), str(10**30),
                                                     str(-(2**63)), "1e3", "0x10", "", "nan", "½", " 2"]))
FLOATS = st.sampled_from(["inf", "-inf", "nan", "1e308", "1e400", "1e-308", "0", "-1", "1", "2.5", "abc", ""])
TEXTS = st.one_of(st.sampled_from(["ab", "", " ", "\udce9\udcff", "x" * 5000, "<|endoftext|>", "llama", "gpt2",
                                   "norm", "sampler", "cpu", "cuda", "cuda:7", "meta", "mps", "xla", "0", "-1", "64M",
                                   "unlimited", "1e400", "auto", "[{kind: top_k, k: 3}]", "{kind: top_p, p: 2}",
                                   "[1, 2]", "greedy"]),
                  st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"), max_size=12))
SETTINGS = st.sampled_from(["train.lr=1e308", "train.lr=nan", "model.n_layers=9007199254740993", "model.n_layers=true",
                            "model.d_model=1e9", "train.batch_size=0", "train.batch_size=2", "model.context_length=8",
                            "train.eval_every=1", "x", "=", "model=3", "train.nope=1", "train.threads=0",
                            "model.vocab_size=-1", "train.seed=18446744073709551617", "train.lr=\udce9"])
PATH_DESTS = {"spec", "specs", "checkpoint", "directory", "output", "data", "out", "tokenizer", "spec_out",
              "prompt_file", "resume", "dir", "include_path"}


def value_for(action: argparse.Action) -> st.SearchStrategy[str]:
    if action.choices:
        return st.one_of(st.sampled_from(sorted(action.choices)), TEXTS)
    if action.type is int:
        return INTS
    if action.type is float:
        return FLOATS
    if action.dest == "overrides":
        return SETTINGS
    if action.dest in PATH_DESTS:
        return st.one_of(st.sampled_from(PATHS), st.sampled_from(PATHS), st.sampled_from(PATHS), TEXTS)
    return TEXTS


#: A working invocation of every command; cases start from it about half the time, so most reach the command's own checks.
BASE = {
    ("validate",): [f"{PREFIX}tiny.yaml"],
    ("summary",): [f"{PREFIX}tiny.safetensors"],
    ("generate",): [f"{PREFIX}tiny.safetensors", "--prompt", "ab", "--max-new-tokens", "2"],
    ("components",): [],
    ("schema",): [],
    ("hf", "import"): [f"{PREFIX}hf", f"{PREFIX}out.safetensors"],
    ("hf", "export"): [f"{PREFIX}tiny.safetensors", f"{PREFIX}out"],
    ("hf", "attach-tokenizer"): [f"{PREFIX}tiny.safetensors", f"{PREFIX}tokenizer.json", "--force"],
    ("hf", "families"): [],
    ("train",): [f"{PREFIX}tiny.yaml", "--out", f"{PREFIX}run"],
}


@st.composite
def argvs(draw: Any) -> list[str]:
    path = draw(st.sampled_from(COMMANDS))
    argv: list[str] = []
    # Hypothesis draws small integers and first elements most often: the usual choice comes first.
    if draw(st.integers(0, 5)) == 5:
        argv += ["--max-memory", draw(st.sampled_from(["64M", "unlimited", "0", "-1", "1e400", "abc", "1T", ""]))]
    argv += list(path)
    words: list[list[str]] = []
    from_base = draw(st.sampled_from([True, True, False]))
    if from_base:
        argv += BASE[path]
    positionals = [a for a in ACTIONS[path] if not a.option_strings]
    optionals = [a for a in ACTIONS[path] if a.option_strings]
    for action in positionals if not from_base else []:  # usually once, sometimes missing or twice
        count = draw(st.sampled_from([1] * 8 + [0, 2]))
        words += [[draw(value_for(action))] for _ in range(count)]
    # A few options at a time (most cases then reach the command's work, not just its first refusal).
    chosen = draw(st.lists(st.sampled_from(range(len(optionals))), max_size=min(3, len(optionals)), unique=True)) \
        if optionals else []
    for action in (optionals[i] for i in chosen):
        flag = draw(st.sampled_from(action.option_strings))
        if action.nargs == 0 or (action.nargs == "?" and draw(st.booleans())):
            words.append([flag])
        else:
            words.append([flag, draw(value_for(action))])
    if draw(st.integers(0, 9)) == 9:
        words.append([draw(st.sampled_from(["--nope", "-x", "--", "--help", "extra", "-", "--json=1", "--force=yes"]))])
    if from_base:  # options after the positionals, as people write them
        argv += [w for group in words for w in group]
    else:
        argv += [w for group in draw(st.permutations(words)) for w in group]
    if path == ("train",):
        argv += ["--data", f"{PREFIX}corpus.txt", "--steps", draw(st.sampled_from(["1", "1", "0"]))]
    return argv


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """The sentinel folder, holding the originals that every case copies into its own folder."""
    folder = sentinel(tmp_path_factory, "cli")
    (folder / f"{PREFIX}tiny.yaml").write_text(yaml.safe_dump(SPEC))
    specformer.save(specformer.build(SPEC, seed=0), folder / f"{PREFIX}tiny.safetensors")
    result = run_cli(["hf", "export", str(folder / f"{PREFIX}tiny.safetensors"), str(folder / f"{PREFIX}hf")])
    assert result.code == 0, result.err
    (folder / f"{PREFIX}corpus.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    _bpe(folder / f"{PREFIX}tokenizer.json")
    (folder / f"{PREFIX}garbage.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    (folder / f"{PREFIX}bad.yaml").write_text("model: {vocab_size: [}\n")
    return folder


def _bpe(path: Path) -> None:
    """A small byte-level BPE tokenizer.json with the end-of-text token (for attach-tokenizer and import --tokenizer)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20,
                                  trainers.BpeTrainer(vocab_size=60, special_tokens=["<|endoftext|>"]))
    assert tokenizer.get_vocab_size() <= SPEC["model"]["vocab_size"]
    tokenizer.save(str(path))


def _populate(case_work: Path, outside: Path) -> None:
    for item in outside.iterdir():
        if item.name.startswith(PREFIX):
            (shutil.copytree if item.is_dir() else shutil.copy2)(item, case_work / item.name)
    (case_work / f"{PREFIX}empty").mkdir()


def _case(outside: Path, argv: list[str]) -> None:
    with case_dir(outside) as case:
        _populate(case.work, outside)
        result = run_cli(argv)
        words = argv[2:] if argv[0] == "--max-memory" else argv
        event(f"{' '.join(words[:2]) if words[0] == 'hf' else words[0]}: exit {result.code}")


@FAST
@given(argv=argvs())
@example(argv=["summary", f"{PREFIX}tiny.safetensors"])
@example(argv=["generate", f"{PREFIX}tiny.safetensors", "--prompt", "ab", "--num-beams", "1000000"])
@example(argv=["generate", f"{PREFIX}tiny.safetensors", "--prompt", "\udce9\udcff", "--max-new-tokens", "2"])
@example(argv=["hf", "export", f"{PREFIX}tiny.safetensors", f"{PREFIX}hf"])  # a non-empty target without --force
@example(argv=["hf", "import", f"{PREFIX}hf", f"{PREFIX}missing/out.safetensors"])
@example(argv=["train", f"{PREFIX}tiny.yaml", "--set", "train.lr=1e308", "--data", f"{PREFIX}corpus.txt", "--steps", "0"])
@example(argv=["train", f"{PREFIX}tiny.yaml", "--steps", str(2**53 + 1), "--data", f"{PREFIX}corpus.txt", "--steps", "0"])
@example(argv=["train", f"{PREFIX}tiny.yaml", "--set", "train.seed=18446744073709551617", "--data", f"{PREFIX}corpus.txt",
               "--steps", "1"])  # torch.manual_seed's ValueError (found by fuzzing)
@example(argv=["generate", f"{PREFIX}tiny.safetensors", "--prompt", "ab", "--max-new-tokens", "2", "--batch",
               "--length-penalty", "inf"])  # generate()'s ValueError reached the CLI (found by fuzzing)
@example(argv=["generate", f"{PREFIX}tiny.safetensors", "--prompt", "ab", "--device", "meta"])  # NotImplementedError
def test_any_command_line(outside, argv):
    _case(outside, argv)


@pytest.mark.slow
@SLOW
@given(argv=argvs())
def test_any_command_line_many(outside, argv):
    _case(outside, argv)


BOMB = "\n".join(["a0: &a0 [x, x, x, x, x, x, x, x, x]"] +
                 [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\nmodel: {vocab_size: *a9}\n"


@pytest.mark.parametrize("argv", [
    pytest.param(["validate", f"{PREFIX}bomb.yaml"], id="alias-bomb"),
    pytest.param(["summary", f"{PREFIX}huge.yaml"], id="a-million-layers", marks=pytest.mark.slow),
    pytest.param(["generate", f"{PREFIX}tiny.safetensors", "--prompt", "ab", "--num-beams", "1000000"],
                 id="a-million-beams", marks=pytest.mark.slow),
])
def test_inputs_that_hung_stay_bounded_in_a_capped_process(outside, argv):
    """In a child with 8 GiB of address space and 64 MiB for models: a clear answer, well within the timeout."""
    with case_dir(outside) as case:
        _populate(case.work, outside)
        (case.work / f"{PREFIX}bomb.yaml").write_text(BOMB)
        (case.work / f"{PREFIX}huge.yaml").write_text(yaml.safe_dump({"model": {**SPEC["model"], "n_layers": 1_000_000}}))
        result = run_cli_subprocess(argv, cwd=case.work, timeout=120)
        assert result.code == (0 if argv[0] == "summary" else 2), result.err
