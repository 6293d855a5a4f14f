"""Every command the project prints, collected and run: README.md, docs/*.md, ``--help`` epilogs, hints.

A command a user copies from the docs must work. This module finds them (shell lines of
``bash``/``sh``/``console`` blocks, ``$`` lines of ``text`` blocks, example lines of every
subcommand's epilog), says what happens to each (:func:`plan`: run it, with the stated
substitutions, or skip it for the stated reason), and runs the plan in fresh interpreters
(``python printed_commands.py PLAN.json RESULTS.json``, a few side by side): each source in its own empty workspace holding
a copy of ``specs/``, commands in the order printed, the inputs a page assumes made just
before the command that needs them. A hint that a command prints (``try: specformer
generate ...``) is run right after it, in the same workspace.

Commands run in-process through ``specformer.cli.main``, as the ``specformer`` script
does (a crash counts as exit code 1): one interpreter per group of sources, so torch is
imported once per group. In a fresh virtual environment (tests/docs/test_fresh_setup.py)
they run through that environment's ``specformer`` script instead, as a user types them.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+)(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
                   re.M | re.S)
SHELL_LANGUAGES = {"bash", "sh", "shell", "console", "text"}
#: The marker line of a generated transcript, directly above its block (docs/_hooks/docsgen/transcripts.py).
GENERATED = re.compile(r"<!-- specformer-output: .+? -->[ \t]*\n\Z")
#: A line a command prints to suggest the next one.
HINT = re.compile(r"^(?:try|next|then):\s+(?P<command>specformer\s.+?)\s*$", re.M)


@dataclass
class Printed:
    """One command as printed, where, and what the page says it does."""

    source: str            # "README.md:42" or "specformer train --help"
    text: str              # the command with its continuation lines joined, comments removed
    expected_code: int = 0
    shown_output: list[str] = field(default_factory=list)  # lines a console block shows below it

    @property
    def id(self) -> str:
        return f"{self.source} {self.text}"


# -- collecting -----------------------------------------------------------------------------


def from_markdown(path: Path) -> list[Printed]:
    """The shell commands of one Markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    name = str(path.relative_to(REPO))
    found: list[Printed] = []
    for block in FENCE.finditer(text):
        language = block["lang"].lower()
        if language not in SHELL_LANGUAGES:
            continue
        if GENERATED.search(text, 0, block.start()):
            continue  # generated from the command itself; test_generated_blocks.py keeps it fresh
        first_line = text.count("\n", 0, block.start("body")) + 1
        lines = [line.removeprefix(block["indent"]) for line in block["body"].splitlines()]
        prompted = language in ("console", "text")
        if prompted and not any(line.startswith("$ ") for line in lines):
            continue  # a text block of output only
        found += _block_commands(lines, name, first_line, prompted=prompted)
    return found


def _block_commands(lines: list[str], name: str, first_line: int, *, prompted: bool) -> list[Printed]:
    found: list[Printed] = []
    i = 0
    while i < len(lines):
        line, number = lines[i], first_line + i
        i += 1
        if prompted:
            if not line.startswith("$ "):
                if found and line.strip():
                    found[-1].shown_output.append(line)
                continue
            line = line[2:]
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.rstrip().endswith("\\") and i < len(lines):  # continuation lines
            line = line.rstrip()[:-1] + " " + lines[i].strip()
            i += 1
        command = strip_comment(line)
        if command == "echo $?":  # the block shows the exit code of the command before
            if found and i < len(lines) and lines[i].strip().isdigit():
                found[-1].expected_code = int(lines[i].strip())
                i += 1
            continue
        found.append(Printed(source=f"{name}:{number}", text=command, expected_code=EXPECTED_CODES.get(command, 0)))
    for printed in found:  # a command shown answering "error: ..." is a user's mistake: exit code 2
        if printed.shown_output and printed.shown_output[0].startswith("error:") and printed.text not in EXPECTED_CODES:
            printed.expected_code = 2
    return found


def without_numbers(text: str) -> str:
    """``text`` with whitespace collapsed and every number written ``N``: shown output is compared
    by its words, since losses, sizes and timings differ from run to run and model to model."""
    return " ".join(re.sub(r"\d[\d,._]*(?:e[-+]?\d+)?", "N", text).split())


def strip_comment(line: str) -> str:
    """The command without a trailing ``# comment`` (a ``#`` inside quotes or a word stays)."""
    quote = None
    for i, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return " ".join(line[:i].split())
    return " ".join(line.split())


def from_epilogs() -> list[Printed]:
    """The example lines of every (sub)command's ``--help`` epilog."""
    from specformer.cli.main import make_parser

    parser, _ = make_parser()
    found: list[Printed] = []
    for prog, sub in _parsers(parser):
        for line in (sub.epilog or "").splitlines():
            line = line.strip()
            if re.match(r"^(specformer|torchrun|python3?|pip)\s", line):
                found.append(Printed(source=f"{prog} --help", text=strip_comment(line)))
    return found


def _parsers(parser: argparse.ArgumentParser):
    yield parser.prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to the same parser
                yield from _parsers(sub)


def collect() -> list[Printed]:
    """Every printed command: README.md, then docs/*.md in name order, then the epilogs."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return [c for page in pages for c in from_markdown(page)] + from_epilogs()


#: A Makefile rule: its target line and its recipe (the tab-indented lines below it).
MAKE_RULE = re.compile(r"^(?P<target>[\w.-]+):[^\n]*\n(?P<recipe>(?:\t[^\n]*\n)+)", re.M)


def make_recipe(target: str, makefile: Path = REPO / "Makefile") -> list[str] | None:
    """The ``specformer`` commands ``make TARGET`` runs, as a user types them in the activated
    environment (``$(VENV)/bin/specformer`` is ``specformer``); None where the recipe runs
    anything else (other than ``echo``), which a printed-command runner cannot stand in for."""
    for rule in MAKE_RULE.finditer(makefile.read_text(encoding="utf-8")):
        if rule["target"] != target:
            continue
        commands = []
        for line in rule["recipe"].splitlines():
            line = re.sub(r"\$\(VENV\)/bin/", "", line.strip().lstrip("@-"))
            if line.startswith("echo "):
                continue
            if not line.startswith("specformer "):
                return None
            commands.append(strip_comment(line))
        return commands
    return None


def expand_make(printed: list[Printed], makefile: Path = REPO / "Makefile") -> list[Printed]:
    """``printed`` with each ``make TARGET`` whose recipe is ``specformer`` commands replaced by
    those commands, at the same source line: what the target does once its set-up (the
    environment) is there. Other ``make`` lines stay as printed (skipped, see SKIPPED)."""
    expanded: list[Printed] = []
    for command in printed:
        words = command.text.split()
        recipe = make_recipe(words[1], makefile) if len(words) == 2 and words[0] == "make" else None
        if recipe is None:
            expanded.append(command)
        else:
            expanded += [Printed(source=command.source, text=text) for text in recipe]
    return expanded


# -- what happens to each -------------------------------------------------------------------

#: Commands not run, each with the reason. Matched against the start of the command.
SKIPPED: list[tuple[str, str]] = [
    (r"make\s", "a make target sets up .venv and runs the whole demo or suite (minutes); CI runs `make test`"),
    (r"\.\s|source\s", "activates a virtual environment in the user's own shell"),
    (r"python3? -m venv\s", "creates a virtual environment for PyTorch and the extras (a download of gigabytes)"),
    (r"pip install\s", "installs into the environment, which tests never change; plugin packages are staged instead "
                       "(tests/fixtures/isolated_plugin.py)"),
    (r"torchrun\s", "starts several processes (DDP/FSDP); tests/plugins/train/parallel/test_distributed.py runs them"),
    (r"python3? benchmarks/", "a benchmark: minutes of timing, printed as ratios (docs/benchmarks.md)"),
    (r"python3? tools/mutation\.py", "the mutation run: minutes to hours of mutmut (the mutation extra); "
                                    "tests/tools/test_mutation.py checks its table"),
    (r"specformer eval .*--tasks\s", "lm-evaluation-harness tasks: the named ones download their data sets from the Hugging "
                                     "Face Hub (no network in tests), my_task is the reader's own; tests/plugins/eval runs a local task"),
    (r"(cp|mv|rm|mkdir|ls|cat)\s", "a plain file operation on the reader's own files; nothing of specformer's runs"),
    (r"pytest\s", "another package's test suite: tests/docs/test_tutorial.py and tests/core/cli/test_scaffold.py run it"),
    (r"ATEN_CPU_CAPABILITY=", "this test suite, or part of it, on another of PyTorch's CPU kernels: CI runs it whole "
                              "(`make test-kernels`)"),
    (r"specformer serve\s", "starts a server that runs until Ctrl-C; tests/plugins/serve/test_cli.py starts one, "
                             "calls it and stops it"),
    (r"curl\s", "an HTTP request to a running server; tests/plugins/serve send the same ones with httpx and the "
                 "openai client"),
    (r"lm_eval\s", "lm-evaluation-harness against a running server, on a task it downloads; "
                    "tests/plugins/serve/test_lm_eval_client.py runs its local-completions model on a local task"),
]

#: Exit codes a page implies without printing ``echo $?`` (the README shows bad.yaml's errors).
EXPECTED_CODES = {"specformer validate bad.yaml": 2}

#: Pages whose commands need a plugin that the page installs first (and the tests stage instead).
PAGE_PLUGINS = {"docs/writing-a-plugin.md": "tutorial"}

#: Small step counts for training, as a test can afford: two optimizer steps (four on --resume,
#: which continues a two-step run), one validation batch, a 16-token sample.
TRAIN_STEPS, RESUME_STEPS = 2, 4
TRAIN_SMALL = ["--set", "train.eval_steps=1", "--set", "train.sample_tokens=16"]


def skip_reason(text: str) -> str | None:
    for pattern, reason in SKIPPED:
        if re.match(pattern, text):
            return reason
    return None


def argv_for(text: str) -> tuple[list[str], str | None]:
    """The ``specformer`` arguments to run for ``text`` (substitutions applied) and a ``>`` target."""
    words = shlex.split(text)
    if words[0] != "specformer":
        raise ValueError(f"not a specformer command and not skip-listed: {text!r} (add a rule to SKIPPED)")
    stdout_to = None
    if ">" in words:
        at = words.index(">")
        if at != len(words) - 2:
            raise ValueError(f"only `command > FILE` is supported: {text!r}")
        stdout_to, words = words[-1], words[:at]
    if any(w in ("|", "&&", "||", ";", "<") for w in words):
        raise ValueError(f"shell syntax the runner does not support: {text!r}")
    argv = words[1:]
    if argv and argv[0] == "train":
        argv = _small_training(argv)
    return argv, stdout_to


def _small_training(argv: list[str]) -> list[str]:
    steps = RESUME_STEPS if "--resume" in argv else TRAIN_STEPS
    out = []
    i = 0
    while i < len(argv):
        if argv[i] == "--steps":
            i += 2
            continue
        if argv[i].startswith("--steps="):
            i += 1
            continue
        out.append(argv[i])
        i += 1
    return out + ["--steps", str(steps), *TRAIN_SMALL]


@dataclass
class Step:
    id: str
    workspace: str
    argv: list[str]
    stdout_to: str | None
    expected_code: int


def plan(printed: list[Printed], root: Path, *, shards: int = 2) -> dict[tuple[str, int], list[Step]]:
    """The steps to run, one workspace per source, grouped by (plugin needed, shard).

    A source's commands stay together and in order; sources are dealt round-robin to
    ``shards`` interpreters per plugin, which run side by side.
    """
    groups: dict[tuple[str, int], list[Step]] = {}
    sources: dict[str, int] = {}
    for command in printed:
        if skip_reason(command.text):
            continue
        try:
            argv, stdout_to = argv_for(command.text)
        except ValueError:
            continue  # its own test reports why it cannot run; the others still run
        page = command.source.rsplit(":", 1)[0] if ":" in command.source else command.source
        shard = sources.setdefault(page, len(sources)) % shards
        workspace = root / re.sub(r"[^\w.-]+", "_", page)
        groups.setdefault((PAGE_PLUGINS.get(page, ""), shard), []).append(
            Step(command.id, str(workspace), argv, stdout_to, command.expected_code))
    return groups


# -- inputs a page assumes --------------------------------------------------------------------

BAD_SPEC = """\
model:
  vocab_size: 259
  d_model: 128
  n_layers: 4
  context_length: 128
  positional: {kind: rope}
  block:
    norm: rmsnrom
    mixer: {kind: attention, n_heads: 4, n_kv_heads: 3}
    ffn: {kind: swiglu}
"""

#: The shape of docs/interop.md's example import (90,432 parameters), for the local Hugging Face folders.
TINY_LLAMA_SPEC = {"model": {
    "vocab_size": 128, "d_model": 64, "n_layers": 2, "context_length": 128, "tie_embeddings": False,
    "positional": {"kind": "rope", "theta": 10000.0},
    "block": {"norm": {"kind": "rmsnorm", "eps": 1.0e-6},
              "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2},
              "ffn": {"kind": "swiglu", "hidden": 128}},
}}
#: A small byte-level model with a long context, for the examples that evaluate in 1024-token windows.
LONG_CONTEXT_SPEC = {"model": {
    "vocab_size": 259, "d_model": 32, "n_layers": 2, "context_length": 1024, "positional": {"kind": "rope"},
    "block": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 4}, "ffn": {"kind": "swiglu"}},
}}
ALIBI_SPEC = {"model": {
    "vocab_size": 259, "d_model": 32, "n_layers": 2, "context_length": 64, "positional": {"kind": "alibi"},
    "block": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 4}, "ffn": {"kind": "swiglu"}},
}}


#: Real text for the corpora a page names: the start of four of this repository's pages, 34 kB in all
#: whatever the pages grow to (they reached 100 kB, and an `eval` over them took 20 seconds), so that
#: training and evaluating on it takes a second, yet a 10% validation split still fills a batch.
CORPUS_PAGES = ("concepts.md", "getting-started.md", "writing-a-plugin.md", "writing-specs.md")
CORPUS_CHARS_PER_PAGE = 8_500


def _page_text(name: str) -> str:
    return (REPO / "docs" / name).read_text(encoding="utf-8")[:CORPUS_CHARS_PER_PAGE]


def _corpus(path: Path, suffix: str = ".md") -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name in CORPUS_PAGES:
        (path / name).with_suffix(suffix).write_text(_page_text(name), encoding="utf-8")


def _checkpoint(spec, path: Path) -> None:
    import specformer

    path.parent.mkdir(parents=True, exist_ok=True)
    specformer.save(specformer.build(spec, seed=0), path)


def _hf_folder(path: Path) -> None:
    """A local Hugging Face Llama folder (config.json + model.safetensors, no tokenizer)."""
    import specformer
    import specformer_hf

    specformer_hf.to_hf(specformer.build(TINY_LLAMA_SPEC, seed=0), path)


def _imported_llama(path: Path) -> None:
    """What `specformer hf import` makes of a Llama folder without tokenizer.json (a checkpoint without a tokenizer)."""
    from specformer.cli.main import main

    folder = path.parent / f".{path.stem}-hf"
    _hf_folder(folder)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        if main(["hf", "import", str(folder), str(path)]) != 0:
            raise RuntimeError(f"could not import {folder} for {path.name}")


def _tokenizer(path: Path) -> None:
    """A 128-token word-level ``tokenizer.json`` (Llama's special tokens first) for the tiny Llama folder."""
    from collections import Counter

    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Counter(w for name in CORPUS_PAGES for w in _page_text(name).split() if w.isalpha())
    vocab = {token: i for i, token in enumerate(["<unk>", "<s>", "</s>", *sorted(w for w, _ in words.most_common(125))])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<unk>", "<s>", "</s>"])
    folder = path.parent if path.suffix == ".json" else path
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))


def _chats(path: Path) -> None:
    """docs/fine-tuning.md's chat data: 300 short conversations (jsonl with messages)."""
    import json

    facts = [("colour of the sky", "blue"), ("colour of grass", "green"), ("sound of a cat", "meow"),
             ("sound of a dog", "woof"), ("capital of France", "Paris"), ("capital of Italy", "Rome")]
    lines = [json.dumps({"messages": [{"role": "user", "content": f"What is the {q}?"},
                                      {"role": "assistant", "content": f"The {q} is {a}."}]})
             for i in range(300) for q, a in [facts[i % len(facts)]]]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _repository_file(name: str) -> Any:
    """A maker of the repository's file ``name`` at ``path`` in the workspace (a clone has it there)."""
    def make(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, path)

    return make


def _text_file(path: Path) -> None:
    path.write_text("\n\n".join(_page_text(name) for name in CORPUS_PAGES), encoding="utf-8")


EVALUATED = "examples/specformer-tutorial/src/specformer_tutorial/dyt.py"
#: What a page takes for granted, by the name a command gives it. The workspace stands for a
#: clone of this repository (specs/, README.md and the files named here are there) after `make demo` (runs/tiny/).
INPUTS = {
    "README.md": lambda p: shutil.copy(REPO / "README.md", p),
    EVALUATED: _repository_file(EVALUATED),  # evaluation.md's example
    "notes.txt": _text_file,
    "chats.jsonl": _chats,
    "llama.safetensors": _imported_llama,
    "llama-tokenizer": _tokenizer,
    "llama-tokenizer/tokenizer.json": _tokenizer,
    "my_corpus": _corpus,
    "notes": _corpus,
    "bad.yaml": lambda p: p.write_text(BAD_SPEC),
    "sampler.yaml": lambda p: p.write_text("- {kind: top_k, k: 40}\n- {kind: temperature, value: 0.8}\n"),
    "run/ckpt.safetensors": lambda p: _checkpoint(REPO / "specs" / "shakespeare-char.yaml", p),  # generation.md's "ROMEO:"
    "runs/tiny/model.safetensors": lambda p: _checkpoint(REPO / "specs" / "tiny.yaml", p),  # what `make demo` leaves
    "alibi.safetensors": lambda p: _checkpoint(ALIBI_SPEC, p),
    "model.safetensors": lambda p: _checkpoint(LONG_CONTEXT_SPEC, p),
    "run/small.safetensors": lambda p: _checkpoint(LONG_CONTEXT_SPEC, p),  # a smaller draft model, same bytes
    "code.py": lambda p: p.write_text("def add(a, b):\n    return a + b\n"),
    "books/*.txt": lambda p: _corpus(p.parent, ".txt"),
    "Llama-3.2-1B": _hf_folder,
    "tiny-llama": _hf_folder,
}


#: Where a command names what it writes, which must never be made beforehand as an input.
OUTPUT_FLAGS = {"-o", "--out", "--spec-out"}
OUTPUT_POSITIONALS = {("hf", "import"): 1, ("hf", "export"): 1}  # the n-th positional after the subcommand


def outputs(argv: list[str]) -> set[str]:
    named = {argv[i + 1] for i, word in enumerate(argv[:-1]) if word in OUTPUT_FLAGS}
    position = OUTPUT_POSITIONALS.get(tuple(argv[:2]))
    positionals = [w for w in argv[2:] if not w.startswith("-")]
    if position is not None and len(positionals) > position:
        named.add(positionals[position])
    return named


def make_inputs(argv: list[str], workspace: Path) -> None:
    """Create the inputs named in ``argv`` that the workspace lacks (made by an earlier command otherwise)."""
    written = outputs(argv)
    for word in argv:
        if word in written:
            continue
        key = os.path.normpath(word)
        if key not in INPUTS:
            continue
        target = workspace / key
        present = any(target.parent.glob(target.name)) if "*" in key else target.exists()
        if not present:
            INPUTS[key](target)


# -- running in the background (from the test session) --------------------------------------


class Runs:
    """The plan's groups running side by side, each in its own interpreter, from the moment
    this is made; :meth:`results` waits for them. ``plugins`` are the staged plugin packages
    (tests/fixtures/isolated_plugin.py) the groups of PAGE_PLUGINS need, by name.

    By default the runners are this interpreter in this environment, and run each command
    in-process. ``python``, ``environ`` and ``script`` run them in another environment (a
    fresh virtual environment: tests/docs/test_fresh_setup.py) instead, each command through
    the ``script`` that ``environ``'s PATH finds, in a process of its own, as a user's shell does.
    """

    def __init__(self, printed: list[Printed], root: Path, plugins: dict[str, Any], *,
                 python: str = sys.executable, environ: dict[str, str] | None = None,
                 script: str | None = None) -> None:
        self.root = root
        base = {**(os.environ if environ is None else environ),
                "SPECFORMER_CACHE": str(root / "cache"), "COLUMNS": "120"}
        self.running: list[tuple[subprocess.Popen, Path, Path]] = []
        for (plugin, shard), steps in plan(printed, root / "workspaces").items():
            name = f"{plugin or 'core'}-{shard}"
            plan_file, out, log = root / f"plan-{name}.json", root / f"results-{name}.json", root / f"log-{name}.txt"
            plan_file.write_text(json.dumps([asdict(s) for s in steps]))
            env = plugins[plugin].env(base) if plugin else base
            with log.open("w") as log_file:
                process = subprocess.Popen([python, __file__, str(plan_file), str(out), *([script] if script else [])],
                                           env=env, stdout=log_file, stderr=subprocess.STDOUT)
            self.running.append((process, out, log))

    def results(self) -> dict[str, dict]:
        """Every result by command id (hints under ``hint: ...``); fails if a runner crashed."""
        found: dict[str, dict] = {}
        for process, out, log in self.running:
            process.wait(timeout=600)
            if process.returncode != 0 or not out.is_file():
                raise AssertionError(f"the runner crashed:\n{log.read_text(errors='replace')}")
            for result in json.loads(out.read_text()):
                found.setdefault(result["id"], result)
        return found

    def stop(self) -> None:
        for process, _, _ in self.running:
            if process.poll() is None:
                process.kill()
                process.wait()


#: The runs a test session started early (tests/docs/conftest.py), for the test module to pick up.
started: Runs | None = None


# -- checking a result -----------------------------------------------------------------------


def check(command: Printed, result: dict) -> None:
    """Fails unless ``command`` exited as its page implies and printed every line the page shows below it."""
    assert result["code"] == command.expected_code, (
        f"{command.source}: `{command.text}` (run as `specformer {' '.join(result['argv'])}`) exited "
        f"{result['code']}, the page implies {command.expected_code}:\n{result['output']}"
    )
    output = without_numbers(result["output"])
    for line in command.shown_output:
        if line.strip() in ("...", "…"):
            continue
        assert without_numbers(line) in output, (
            f"{command.source}: the page shows\n  {line.strip()}\nbut `{command.text}` printed:\n{result['output']}"
        )


def failed_hints(results: dict[str, dict]) -> list[str]:
    """What went wrong with each printed hint that failed (none: every hint a command printed works)."""
    return [f"{r['id']} (printed by {r['hint_of']}) exited {r['code']}:\n{r['output']}"
            for r in results.values() if r["hint_of"] and r["code"]]


# -- running (in the fresh interpreter) --------------------------------------------------------


@dataclass
class Result:
    id: str
    argv: list[str]
    code: int
    output: str
    seconds: float
    hint_of: str | None = None


def run_in_process(argv: list[str], workspace: Path, stdout_to: str | None) -> tuple[int, str, str]:
    from specformer.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    old_cwd, old_stdin = os.getcwd(), sys.stdin
    os.chdir(workspace)
    sys.stdin = io.StringIO("")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse: --help, usage errors
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
            except Exception:  # a crash: the script would print the traceback and exit 1
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(old_cwd)
        sys.stdin = old_stdin
    if stdout_to is not None:
        (workspace / stdout_to).write_text(out.getvalue())
    return int(code or 0), out.getvalue(), err.getvalue()


def run_script(script: str, argv: list[str], workspace: Path, stdout_to: str | None) -> tuple[int, str, str]:
    """:func:`run_in_process`'s result, the command run through the ``script`` on PATH in a process of its own."""
    done = subprocess.run([script, *argv], cwd=workspace, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=600)
    if stdout_to is not None:
        (workspace / stdout_to).write_text(done.stdout)
    return done.returncode, done.stdout, done.stderr


def run_plan(steps: list[dict], script: str | None = None) -> list[Result]:
    """Each step's result, its printed hints' after it; each command in-process, or through ``script``."""
    def run_one(argv: list[str], workspace: Path, stdout_to: str | None) -> tuple[int, str, str]:
        if script is None:
            return run_in_process(argv, workspace, stdout_to)
        return run_script(script, argv, workspace, stdout_to)

    results: list[Result] = []
    for step in steps:
        workspace = Path(step["workspace"])
        if not workspace.exists():
            workspace.mkdir(parents=True)
            shutil.copytree(REPO / "specs", workspace / "specs")
        start = time.perf_counter()
        try:
            make_inputs(step["argv"], workspace)
        except Exception:  # reported as this command's failure; the others still run
            results.append(Result(step["id"], step["argv"], 1, "making its inputs failed:\n" + traceback.format_exc(), 0.0))
            continue
        code, out, err = run_one(step["argv"], workspace, step["stdout_to"])
        results.append(Result(step["id"], step["argv"], code, _tail(out + err), time.perf_counter() - start))
        for hint in HINT.finditer(out + "\n" + err):  # a printed hint runs next, where it was printed
            # No inputs are made for a hint: what it names must exist because the command made it.
            try:
                argv, stdout_to = argv_for(hint["command"])
            except ValueError as exc:
                results.append(Result(f"hint: {hint['command']}", [], 1, str(exc), 0.0, hint_of=step["id"]))
                continue
            start = time.perf_counter()
            h_code, h_out, h_err = run_one(argv, workspace, stdout_to)
            results.append(Result(f"hint: {hint['command']}", argv, h_code, _tail(h_out + h_err),
                                  time.perf_counter() - start, hint_of=step["id"]))
    return results


def _tail(text: str, limit: int = 6000, head: int = 2000) -> str:
    # Progress bars redraw with carriage returns: keep what a terminal would show last.
    lines = [line.rsplit("\r", 1)[-1] for line in text.splitlines()]
    text = "\n".join(lines)
    # The start too: a page shows a long output's first lines then "..." (hf export --verbose, one line a family).
    return text if len(text) <= head + limit else text[:head] + "\n...\n" + text[-limit:]


if __name__ == "__main__":  # python printed_commands.py PLAN.json RESULTS.json [SCRIPT]
    steps = json.loads(Path(sys.argv[1]).read_text())
    script = sys.argv[3] if len(sys.argv) > 3 else None
    Path(sys.argv[2]).write_text(json.dumps([asdict(r) for r in run_plan(steps, script)]))
