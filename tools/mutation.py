"""Mutation testing: plant small bugs in one module at a time and check that its tests catch them.

Runs mutmut 3 (https://github.com/boxed/mutmut, the ``mutation`` extra) over the modules in
``MODULES`` below, each with the test files that cover it, and prints per module the score
(killed / tested) and every surviving mutant as ``file:line`` with its stable id and its diff. A
survivor is a behaviour change no test noticed: add a test that pins the behaviour
(docs/testing.md), or, if the mutant cannot change behaviour, add its id to
``tools/mutation_equivalents.json`` with the reason.

    .venv/bin/python tools/mutation.py                          # every module in MODULES
    .venv/bin/python tools/mutation.py --modules plugins/specformer_train/schedule.py
    .venv/bin/python tools/mutation.py --modules plugins/specformer_generate/beam.py \
        --tests tests/plugins/generate/test_gen_beam.py        # other test files than MODULES names
    .venv/bin/python tools/mutation.py --max-mutants 60 --budget 300 --jobs 2

Which tests run: the files ``MODULES`` (or ``--tests``) names, less the tests marked ``slow`` or
``mutation_exempt`` (each such mark gives its reason: mutmut's trampolines break the test on
unmutated code, as with torch.compile and warning stack levels, or it takes seconds per mutant
where a faster test pins the same behaviour). Tests are never chosen by name.

Stable mutant ids. An equivalent mutant is recorded as
``module::qualname::before -> after`` (`` #k`` appended when the same ``before`` occurs k times
earlier in the function), for example
``plugins/specformer_train/schedule.py::learning_rate::step < warmup_steps -> step <= warmup_steps``.
``before`` and ``after`` are the changed part of the function printed by ``ast.unparse``: the
simple statement that holds the change, or in a compound statement only its header expression
(an ``if``'s test, a ``for``'s iterable), or for a signature default ``param name=value``. Printing
from the syntax tree makes the id independent of layout (line breaks, spacing, quotes, comments),
and keying by the enclosing function and statement, not by line numbers or mutmut's per-function
counter, keeps it valid when any other statement or function changes. A change to the statement
itself, or a renamed function, retires the id; ``stale_entries`` lists such ids, and
``tests/tools/test_mutation.py`` fails on them, so the table cannot go stale unnoticed.

Why a staging copy: mutmut derives module names from file paths under ``src/`` (or the project
root), while specformer's packages live in ``core/`` and ``plugins/`` and are installed into
``.venv`` in editable mode. Each module is therefore run in ``build/mutation/<name>/``, a copy
with every package under ``src/`` plus ``tests/``, ``specs/``, ``examples/`` and ``benchmarks/``.
mutmut then puts the mutated ``src/`` first on ``sys.path``, ahead of the editable install's
import hook, and the working tree is never touched. Tests run in-process (mutmut forks one
child per mutant after the imports), so torch is imported once per module, not once per mutant.

Bounded time: ``--budget`` seconds per module (the run is stopped and the mutants tested so far
are reported; untested ones are counted as such), ``--max-mutants`` an evenly spread sample of
the module's mutants, ``--jobs`` parallel children. The score ignores mutants that no selected
test executes ("no tests": the table's test list misses them) but prints their count.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGE_ROOT = REPO / "build" / "mutation"
COPIED = ("tests", "specs", "examples", "benchmarks", "tools")  # what the tests read besides the packages
# The tests a run leaves out, by marker (tests/conftest.py registers mutation_exempt): slow ones, and
# those whose mark says why mutmut cannot run them or need not.
SELECTED = "not slow and not mutation_exempt"

# module (path in this repository) -> the test files that cover it. Keep it to the tests that
# exercise the module directly: every selected test runs once per mutant it reaches.
MODULES: dict[str, list[str]] = {
    "plugins/specformer_train/schedule.py": [
        "tests/plugins/train/test_schedule.py",
        "tests/plugins/train/test_schedule_groups.py",
    ],
    # generate()'s own tests reach StopCondition too, but each takes seconds per mutant.
    "plugins/specformer_generate/stopping.py": ["tests/plugins/generate/test_gen_stopping.py"],
    "core/specformer/checkpoint/save_load.py": [
        "tests/core/checkpoint/test_checkpoint.py",
        "tests/core/checkpoint/test_checkpoint_headers.py",
    ],
    "core/specformer/checkpoint/check.py": [
        "tests/core/checkpoint/test_checkpoint.py",
        "tests/core/checkpoint/test_checkpoint_headers.py",
    ],
    "core/specformer/checkpoint/file.py": [
        "tests/core/checkpoint/test_checkpoint.py",
        "tests/core/checkpoint/test_checkpoint_headers.py",
    ],
    "plugins/specformer_train/checkpointing.py": [
        "tests/plugins/train/test_checkpointing.py",
    ],
    # The training loop: the Trainer tests (a tiny model, a few steps per test); its end-to-end tests
    # train for seconds each and are marked mutation_exempt.
    "plugins/specformer_train/trainer.py": ["tests/plugins/train/test_trainer.py"],
    # The mask rule as the kernels evaluate it (it lived in core/specformer/model/context.py and masks.py).
    "plugins/specformer_layers/attention/masking.py": [
        "tests/plugins/layers/attention/test_masking.py",
    ],
    # test_import_errors.py reaches it too, through whole imports: slower, and no extra kills.
    "plugins/specformer_hf/config.py": [
        "tests/plugins/hf/test_config.py",
        "tests/plugins/hf/test_config_vintages.py",
    ],
    "plugins/specformer_generate/beam.py": [
        "tests/plugins/generate/test_gen_beam.py",
        "tests/plugins/generate/test_gen_beam_penalty.py",
    ],
    # test_gen_cache.py's StaticKVCache tests drive the cache directly against slots written out in the
    # test; its whole-model tests (and test_cache_contract.py) take over a minute per mutant: exempt.
    "plugins/specformer_generate/cache.py": ["tests/plugins/generate/test_gen_cache.py"],
    # Speculative decoding: its greedy tokens against plain greedy, its samples against the distribution.
    "plugins/specformer_generate/speculative.py": ["tests/plugins/generate/test_gen_speculative.py"],
    # The decode loop and generate()'s own bookkeeping (padding, trimming, the token count), and the
    # paths it dispatches to: past-context checks, speculative decoding, beam search.
    "plugins/specformer_generate/generation.py": ["tests/plugins/generate/test_gen_generate.py",
                                                "tests/plugins/generate/test_gen_padding.py",
                                                "tests/plugins/generate/test_past_context.py",
                                                "tests/plugins/generate/test_gen_speculative.py",
                                                "tests/plugins/generate/test_gen_beam.py"],
    # Each sampler is one small module; its formula tests (and the transformers comparisons) live together.
    **{f"plugins/specformer_generate/samplers/{name}.py": ["tests/plugins/generate/test_gen_samplers.py"]
       for name in ("greedy", "temperature", "top_k", "top_p", "min_p", "typical", "repetition", "penalties",
                    "no_repeat_ngram", "history", "pipeline")},
    "plugins/specformer_train/data.py": [
        "tests/plugins/train/test_data.py",
    ],
    "plugins/specformer_train/optim.py": [
        "tests/plugins/train/test_optim.py",
        "tests/plugins/train/test_optimizer_step.py",
    ],
}

EQUIVALENTS_FILE = Path(__file__).with_name("mutation_equivalents.json")
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
COMPOUND = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match, *FUNCTIONS,
            ast.ClassDef)


def load_equivalents(path: Path = EQUIVALENTS_FILE) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The equivalent mutants by stable id, and the patterns that cover whole families of them."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["mutants"], data["patterns"]


def stable_id(module: str, qualname: str, original: ast.AST, mutant: ast.AST) -> str:
    """``module::qualname::before -> after`` (`` #k`` when an equal part comes earlier in the function).

    ``before`` and ``after`` are the changed part of the function, printed by ``ast.unparse``: the
    simple statement holding the change; in a compound statement's header the header expression
    (an ``if``'s test, a ``for``'s iterable); in a signature ``param name=default``.
    """
    chain = differing_chain(original, mutant)
    before, after = part_of(chain, original)
    texts = [part_text(node, original) for node in parts(original)]
    mine = part_text(before, original)
    earlier = next((k for k, node in enumerate(parts(original)) if node is before), 0)
    occurrence = texts[:earlier].count(mine)
    suffix = f" #{occurrence}" if occurrence else ""
    return f"{module}::{qualname}::{mine} -> {part_text(after, mutant)}{suffix}"


def differing_chain(a: ast.AST, b: ast.AST) -> list[tuple[ast.AST, ast.AST]]:
    """Pairs of nodes from ``(a, b)`` inward, each holding every difference; the last is the innermost."""
    chain = [(a, b)]
    while True:
        a, b = chain[-1]
        inner: list[tuple[ast.AST, ast.AST] | None] = []
        for name in a._fields:
            if name == "name" and isinstance(a, FUNCTIONS):
                continue  # mutmut's generated names
            x, y = getattr(a, name, None), getattr(b, name, None)
            pairs = list(zip(x, y)) if isinstance(x, list) and isinstance(y, list) and len(x) == len(y) else [(x, y)]
            for u, v in pairs:
                if isinstance(u, ast.AST) and isinstance(v, ast.AST):
                    if ast.dump(u) != ast.dump(v):
                        inner.append((u, v))  # a node of another type ends the descent below
                elif u != v:
                    inner.append(None)  # a list of another length, or another value: a itself is the change
        if len(inner) != 1 or inner[0] is None:
            return chain
        chain.append(inner[0])
        if type(inner[0][0]) is not type(inner[0][1]):
            return chain


def part_of(chain: list[tuple[ast.AST, ast.AST]], function: ast.AST) -> tuple[ast.AST, ast.AST]:
    """The innermost pair in ``chain`` that is one of the function's :func:`parts` (else the function)."""
    known = {id(node) for node in parts(function)}
    return next(((a, b) for a, b in reversed(chain) if id(a) in known), chain[0])


def parts(function: ast.AST) -> list[ast.AST]:
    """The nodes a change is attributed to, in a fixed order: simple statements, compound headers, defaults."""
    found: list[ast.AST] = []
    for node in ast.walk(function):
        if isinstance(node, ast.stmt) and not isinstance(node, COMPOUND):
            found.append(node)
        elif isinstance(node, COMPOUND) and node is not function:
            found.append(node)
        elif isinstance(node, ast.arguments):
            found.extend(d for d in [*node.defaults, *node.kw_defaults] if d is not None)
        if isinstance(node, COMPOUND):
            for name in ("test", "iter", "subject"):
                if isinstance(getattr(node, name, None), ast.expr):
                    found.append(getattr(node, name))
            found.extend(getattr(node, "items", []))
    return found


def part_text(node: ast.AST, function: ast.AST) -> str:
    """How a part reads in an id: its source as ``ast.unparse`` prints it, a default as ``param name=value``."""
    for arguments in (n for n in ast.walk(function) if isinstance(n, ast.arguments)):
        positional = [*arguments.posonlyargs, *arguments.args]
        for arg, default in [*zip(positional[len(positional) - len(arguments.defaults):], arguments.defaults),
                             *zip(arguments.kwonlyargs, arguments.kw_defaults)]:
            if default is node:
                return f"param {arg.arg}={ast.unparse(node)}"
    if isinstance(node, COMPOUND):
        return ast.unparse(node).split("\n", 1)[0]  # only the header
    return ast.unparse(node)


def mutant_ids(mutated: Path, module: str) -> dict[str, str]:
    """mutmut's name of every mutant in the mutated copy of ``module`` -> its stable id."""
    tree = ast.parse(mutated.read_text(encoding="utf-8"))
    defs: dict[str, ast.AST] = {}
    for node in tree.body:
        members = node.body if isinstance(node, ast.ClassDef) else [node]
        defs.update((m.name, m) for m in members if isinstance(m, FUNCTIONS))
    ids = {}
    for name, node in defs.items():
        prefix, marker, number = name.rpartition("__mutmut_")
        if marker and number.isdigit() and prefix + "__mutmut_orig" in defs:
            ids[name] = stable_id(module, qualname_of(prefix), defs[prefix + "__mutmut_orig"], node)
    return ids


def qualname_of(mangled: str) -> str:
    """mutmut's ``xǁClassǁmethod`` -> ``Class.method``, ``x_function`` -> ``function``."""
    if "ǁ" in mangled:
        _, cls, function = mangled.split("ǁ")
        return f"{cls}.{function}"
    return mangled.removeprefix("x_")


def pattern_equivalence(module: str, before: str, after: str, patterns: list[dict[str, str]]) -> str | None:
    """The reason a survivor belongs to one of the families in the data file's ``patterns``, if it does."""
    for entry in patterns:
        if not module.startswith(entry["module_prefix"]):
            continue
        for match in re.finditer(entry["pattern"], before):
            if before[: match.start()] + match.expand(entry["replacement"]) + before[match.end():] == after:
                return entry["reason"]
    return None


def stale_entries(path: Path = EQUIVALENTS_FILE) -> list[str]:
    """Ids in the data file whose module, function or changed part no longer exists in the code."""
    mutants, _ = load_equivalents(path)
    stale = []
    for mutant in mutants:
        module, qualname, rest = mutant.split("::", 2)
        before = rest.split(" -> ", 1)[0]
        occurrence = int(rest.rpartition(" #")[2]) if re.search(r" #\d+$", rest) else 0
        source = REPO / module
        function = find_function(ast.parse(source.read_text(encoding="utf-8")), qualname) if source.exists() else None
        texts = [part_text(node, function) for node in parts(function)] if function is not None else []
        if texts.count(before) <= occurrence:
            stale.append(mutant)
    return stale


def find_function(tree: ast.Module, qualname: str) -> ast.AST | None:
    scope: list[ast.stmt] = tree.body
    *owners, name = qualname.split(".")
    for owner in owners:
        cls = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if cls is None:
            return None
        scope = cls.body
    return next((n for n in scope if isinstance(n, FUNCTIONS) and n.name == name), None)


@dataclass
class Survivor:
    name: str
    location: str
    diff: str
    equivalent: str | None = None
    id: str = ""


@dataclass
class ModuleResult:
    module: str
    total: int = 0
    sampled: int = 0
    killed: int = 0
    survived: int = 0
    no_tests: int = 0
    not_run: int = 0
    other: int = 0
    seconds: float = 0.0
    survivors: list[Survivor] = field(default_factory=list)

    @property
    def tested(self) -> int:
        return self.killed + self.survived

    def score(self, *, count_equivalent_as_killed: bool) -> float | None:
        if not self.tested:
            return None
        equivalent = sum(1 for s in self.survivors if s.equivalent) if count_equivalent_as_killed else 0
        return 100.0 * (self.killed + equivalent) / self.tested


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", metavar="PATH", help="modules to run (paths as in MODULES); default: all")
    parser.add_argument("--max-mutants", type=int, default=None, help="test at most this many mutants per module, spread evenly")
    parser.add_argument("--budget", type=float, default=600.0, help="seconds per module before the run is stopped (default 600)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants tested in parallel (default 2)")
    parser.add_argument("--code-from", metavar="REV", default=None,
                        help="mutate core/ and plugins/ as of this git revision (tests still come from the working "
                             "tree); default: the working tree")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this file")
    parser.add_argument("--tests", nargs="+", metavar="PATH", default=None,
                        help="test files (or folders) to run for every module given, in place of MODULES' list")
    parser.add_argument("--list", action="store_true", help="print the module table and exit")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so run_bounded can stop mutmut's group

    if args.list:
        for module, tests in MODULES.items():
            print(module)
            for test in tests:
                print(f"    {test}")
        return 0
    modules = args.modules or list(MODULES)
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; known: {', '.join(MODULES)} (edit MODULES to add one)")
    if args.tests is not None:
        missing_tests = [t for t in args.tests if not (REPO / t).exists()]
        if missing_tests:
            parser.error(f"--tests: no such file or folder: {', '.join(missing_tests)}")
    missing = [f"{m}: {t}" for m in modules for t in MODULES[m] if not (REPO / t).exists()]
    if missing and args.tests is None:
        parser.error(f"test file(s) named in MODULES do not exist: {'; '.join(missing)}")
    if args.max_mutants is not None and args.max_mutants < 1:
        parser.error(f"--max-mutants must be at least 1, got {args.max_mutants}")
    try:
        import mutmut  # noqa: F401
    except ImportError:
        print("mutmut is not installed: pip install -e '.[mutation]'", file=sys.stderr)
        return 2

    results = [run_module(m, tests=args.tests or MODULES[m], max_mutants=args.max_mutants, budget=args.budget,
                          jobs=args.jobs, code_from=args.code_from)
               for m in modules]
    print_summary(results, args)
    if args.json:
        args.json.write_text(json.dumps([result_as_dict(r) for r in results], indent=2) + "\n")
    return 0


def run_module(module: str, *, tests: list[str], max_mutants: int | None, budget: float, jobs: int,
               code_from: str | None) -> ModuleResult:
    started = time.monotonic()
    stage = stage_module(module, code_from, tests)
    mutmut = [sys.executable, "-m", "mutmut"]
    print(f"\n=== {module}: mutating, tests: {' '.join(tests)} (-m {SELECTED!r})", flush=True)

    generate_mutants(stage, jobs)
    meta = stage / "mutants" / src_path(module).with_name(Path(module).name + ".meta")
    names = sorted(json.loads(meta.read_text())["exit_code_by_key"], key=mutant_sort_key)
    chosen = spread(names, max_mutants)
    remaining = budget - (time.monotonic() - started)
    stopped = run_bounded([*mutmut, "run", "--max-children", str(jobs), *chosen], cwd=stage, timeout=remaining)

    result = ModuleResult(module=module, total=len(names), sampled=len(chosen))
    ids = mutant_ids(stage / "mutants" / src_path(module), module)
    from mutmut.stats import status_by_exit_code  # mutmut's reading of a child's exit code

    codes = json.loads(meta.read_text())["exit_code_by_key"]
    for name in chosen:
        status = status_by_exit_code[codes.get(name)]
        if status == "not checked":
            result.not_run += 1
        elif status in ("killed", "timeout"):  # a timeout is a kill: the mutant changed behaviour
            result.killed += 1
        elif status == "survived":
            result.survived += 1
            result.survivors.append(describe_survivor(module, name, stage, ids))
        elif status == "no tests":
            result.no_tests += 1
        else:  # suspicious, segfault, ...: reported, not scored
            result.other += 1
    result.seconds = time.monotonic() - started
    print_module(result, stopped)
    return result


def stage_module(module: str, code_from: str | None, tests: list[str]) -> Path:
    """A fresh copy of the project with every package under ``src/`` and mutmut configured for ``module``."""
    stage = STAGE_ROOT / ".".join(src_path(module).with_suffix("").parts[1:])  # specformer_hf.config
    if "mutation" not in stage.parts or not str(stage).startswith(str(STAGE_ROOT)):
        raise RuntimeError(f"refusing to clear {stage}")  # never remove anything outside build/mutation
    shutil.rmtree(stage, ignore_errors=True)
    (stage / "src").mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    code = REPO if code_from is None else export_code(code_from, stage / "code")
    for parent in ("core", "plugins"):
        for package in sorted((code / parent).iterdir()):
            if (package / "__init__.py").exists():
                shutil.copytree(package, stage / "src" / package.name, ignore=ignore)
    for name in COPIED:
        shutil.copytree(REPO / name, stage / name, ignore=ignore)
    if code_from is not None:
        shutil.rmtree(stage / "code")
    shared = REPO.parent / "shared"
    if shared.exists():  # tests/conftest.py looks for shared data next to the repository
        (stage / "shared").symlink_to(shared)
    config = {
        "source_paths": ["src"],
        "only_mutate": [str(src_path(module))],
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q", "-m", SELECTED],
        "pytest_add_cli_args_test_selection": tests,
        "also_copy": list(COPIED),
        "use_git_change_detection": False,
    }
    pyproject = (REPO / "pyproject.toml").read_text()
    lines = ["", "[tool.mutmut]"] + [f"{key} = {json.dumps(value)}" for key, value in config.items()]
    (stage / "pyproject.toml").write_text(pyproject + "\n".join(lines) + "\n")
    return stage


def export_code(revision: str, into: Path) -> Path:
    """``core/`` and ``plugins/`` as of ``revision`` (for a shared tree where others have half-done edits)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", revision, "core", "plugins"], cwd=REPO, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {revision} failed: {archive.stderr.decode()[-500:]}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def src_path(module: str) -> Path:
    """``core/specformer/checkpoint/save_load.py`` -> ``src/specformer/checkpoint/save_load.py`` (the staged path)."""
    parts = Path(module).parts
    if parts[0] not in ("core", "plugins"):
        raise SystemExit(f"{module}: expected a path under core/ or plugins/")
    return Path("src", *parts[1:])


def generate_mutants(stage: Path, jobs: int) -> None:
    """Write the mutated copy and its list of mutants without testing any (mutmut's generation step)."""
    code = (
        "from mutmut.__main__ import copy_src_dir, copy_also_copy_files, create_mutants\n"
        "from mutmut.mutation.trampoline import set_mutant_under_test\n"
        "import os\n"
        "set_mutant_under_test('mutant_generation')\n"
        "os.makedirs('mutants', exist_ok=True)\n"
        f"copy_src_dir(); copy_also_copy_files(); create_mutants({jobs})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=stage, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mutmut could not generate mutants in {stage}:\n{done.stderr[-3000:]}")


def run_bounded(command: list[str], *, cwd: Path, timeout: float) -> bool:
    """Run ``command`` in its own process group; stop the group after ``timeout`` s. True if it was stopped."""
    log = cwd / "mutmut-run.log"
    # One thread per child: mutmut forks after torch has run, and a forked OpenMP thread pool
    # deadlocks; with --jobs children on 2 cores, more threads would only contend anyway.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        try:
            process.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            stop_group(process)
            return True
        except BaseException:  # Ctrl-C or SIGTERM of this script: leave no mutmut children behind
            stop_group(process)
            raise
    if process.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"mutmut failed (exit {process.returncode}) in {cwd}; log {log}:\n{tail}")
    return False


def stop_group(process: subprocess.Popen) -> None:
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def mutant_sort_key(name: str) -> tuple[str, int]:
    function, _, number = name.rpartition("__mutmut_")
    return function, int(number)


def spread(names: list[str], limit: int | None) -> list[str]:
    """At most ``limit`` of ``names``, evenly spaced so every function of the module is sampled."""
    if limit is None or len(names) <= limit:
        return names
    step = len(names) / limit
    return [names[int(i * step)] for i in range(limit)]


def describe_survivor(module: str, name: str, stage: Path, ids: dict[str, str]) -> Survivor:
    shown = subprocess.run([sys.executable, "-m", "mutmut", "show", name], cwd=stage, capture_output=True, text=True)
    diff = "\n".join(line for line in shown.stdout.splitlines() if not line.startswith("#")).strip()
    line, _, _ = changed_line(stage / src_path(module), name, diff)
    mutant = ids.get(name.rpartition(".")[2], "")
    mutants, patterns = load_equivalents()
    before, _, after = mutant.split("::", 2)[-1].partition(" -> ")
    after = re.sub(r" #\d+$", "", after)
    equivalent = mutants.get(mutant) or pattern_equivalence(module, before, after, patterns)
    return Survivor(name=name, location=f"{module}:{line}", diff=diff, equivalent=equivalent, id=mutant)


def changed_line(original: Path, name: str, diff: str) -> tuple[int | str, str, str]:
    """The line of ``original`` the mutant changes (diff hunks count from the function's first line)."""
    from mutmut.utils.format_utils import orig_function_and_class_names_from_key

    function, cls = orig_function_and_class_names_from_key(name)
    start = function_start(original, function, cls)
    removed = next((line[1:] for line in diff.splitlines() if line.startswith("-") and not line.startswith("---")), "")
    added = next((line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")), "")
    hunk = re.search(r"^@@ -(\d+)", diff, re.MULTILINE)
    if start is None:
        return "?", removed, added
    offset = int(hunk.group(1)) - 1 if hunk else 0
    body = diff[hunk.end():].splitlines()[1:] if hunk else [l for l in diff.splitlines() if not l.startswith(("---", "+++"))]
    for line in body:
        if line.startswith("-") or line.startswith("+"):
            break
        offset += 1
    return start + offset, removed, added


def function_start(path: Path, function: str, cls: str | None) -> int | None:
    tree = ast.parse(path.read_text())
    scope = tree.body
    if cls is not None:
        owner = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        scope = owner.body if owner else []
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function:
            return min([node.lineno] + [d.lineno for d in node.decorator_list])
    return None


def print_module(result: ModuleResult, stopped: bool) -> None:
    note = f"stopped after the budget, {result.not_run} not run" if stopped else "complete"
    raw = result.score(count_equivalent_as_killed=False)
    print(f"{result.module}: {result.sampled} of {result.total} mutants tested ({note}); "
          f"killed {result.killed}, survived {result.survived}, no tests {result.no_tests}; "
          f"score {fmt(raw)} in {result.seconds:.0f}s")
    for survivor in result.survivors:
        tag = f"  [equivalent: {survivor.equivalent}]" if survivor.equivalent else ""
        print(f"\n  survived: {survivor.location}  ({survivor.name}){tag}\n    id: {survivor.id}")
        for line in survivor.diff.splitlines():
            if not line.startswith(("---", "+++", "@@")):
                print(f"    {line}")


def print_summary(results: list[ModuleResult], args: argparse.Namespace) -> None:
    print("\n| module | mutants tested | killed | survived | equivalent | score | score without equivalents |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        equivalent = sum(1 for s in r.survivors if s.equivalent)
        print(f"| {r.module} | {r.tested} of {r.total} | {r.killed} | {r.survived} | {equivalent} | "
              f"{fmt(r.score(count_equivalent_as_killed=False))} | {fmt(r.score(count_equivalent_as_killed=True))} |")
    flags = " ".join(a for a in sys.argv[1:])
    print(f"\n(.venv/bin/python tools/mutation.py {flags})".replace(" )", ")"))


def fmt(score: float | None) -> str:
    return "n/a" if score is None else f"{score:.0f}%"


def result_as_dict(r: ModuleResult) -> dict:
    return {
        "module": r.module, "total": r.total, "sampled": r.sampled, "killed": r.killed,
        "survived": r.survived, "no_tests": r.no_tests, "not_run": r.not_run, "seconds": round(r.seconds, 1),
        "survivors": [{"name": s.name, "id": s.id, "location": s.location, "diff": s.diff, "equivalent": s.equivalent}
                      for s in r.survivors],
    }


if __name__ == "__main__":
    sys.exit(main())
