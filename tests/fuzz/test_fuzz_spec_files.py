"""Property-based: any spec file (YAML, JSON or TOML, well-formed or not) validates or is one clear error.

A case is the tiny spec changed at a few paths (the strategies of
``tests/core/spec/test_bad_specs.py``), written as YAML (with anchors and aliases where a
value is shared), JSON or TOML, then spliced with the features of the format that a
person or an attacker can use: YAML tags (``!!python/object/apply``, ``!!binary``,
``!!set``, unknown ones), merge keys, undefined aliases, alias bombs, numbers no
float or tensor can hold, nesting thousands of levels deep, several documents, and
bytes that are not UTF-8 (or a BOM, or UTF-16). The file may also carry another
format's suffix or none that is accepted.

Invariant (``harness``): ``specformer.load_spec`` returns a spec or raises a user
error; ``specformer validate`` and ``specformer summary`` exit 0 or 2 without a
traceback and agree with ``load_spec``; a spec that validates builds under the
64 MiB memory guard or is refused by it; all within the time and memory bounds and
without touching anything outside the case's folder.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import event, example, given
from hypothesis import strategies as st

import specformer
from specformer.errors import MemoryLimitError

from conftest import TINY
from fuzz.harness import FAST, PREFIX, SLOW, case_dir, expect_user_error, load_sibling_tests, outcome, run_cli, sentinel

bad_specs = load_sibling_tests("core/spec/test_bad_specs.py", "_fuzz_bad_specs")


def bomb(levels: int, width: int) -> str:
    """A YAML "billion laughs": ``width ** levels`` values from a few hundred bytes."""
    lines = ["a0: &a0 [x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines)


def nested(depth: int, kind: str) -> str:
    if kind == "list":
        return "[" * depth + "1" + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


YAML_VALUES = [
    "!!python/object/apply:os.system ['touch fz-pwned']", "!!python/name:os.system", "!!binary aGVsbG8=",
    "!!set {a, b}", "!!timestamp 2001-12-14t21:59:43.10-05:00", "!custom 3", "!!float 1e400", "!!int 99999999999999999999999",
    "!!str 32", "!!bool yes", "!!null ''", "1e400", "-1e400", ".nan", "-.inf", "+.inf", "0x7fffffffffffffffffffffff",
    "0o777", "0b1010", "1_000", "123456789012345678901234567890123", "1e-400", "~", "yes", "off", "2001-12-14",
    "*undefined", "&anchor 5", "{<<: *undefined}", "{<<: [1, 2]}", "{<<: {kind: rope}, kind: alibi}",
    "'\\x00'", '"\\u0000\\ud800"', "|\n  block\n", ">-\n  folded\n", "[*x, *x]", "? complex\n: key",
    "\"" + "x" * 5000 + "\"", "&x [&y [*x]]",
]
JSON_VALUES = ["NaN", "Infinity", "-Infinity", "1e400", "123456789012345678901234567890123", "-0", "1.0e-400",
               '"\\ud800"', '"\\u0000"', "true", "null", "{}", "[]", '{"kind": null}', "01", "+1", "0x10", "'x'"]
TOML_VALUES = ["inf", "-inf", "nan", "+nan", "1e400", "123456789012345678901234567890123", "1979-05-27T07:32:00Z",
               "07:32:00", "0x7fffffffffffffffffff", "0o777", "1_000", "true", '"\\u0000"', "'''x'''", "{}", "[]",
               '{ kind = "rope" }', "[1, \"a\", 2.0]"]


@st.composite
def documents(draw: Any) -> dict:
    """The tiny spec with a few paths changed; sometimes with one value shared by two paths (YAML aliases)."""
    spec = copy.deepcopy(TINY)
    for path, value in draw(st.lists(st.tuples(st.sampled_from(bad_specs.PATHS), bad_specs.values), max_size=3)):
        spec = bad_specs.mutate(spec, path, value)
    if draw(st.integers(0, 3)) == 3:  # a size no tensor can have, around the int64 and float64 limits
        spec = bad_specs.mutate(spec, draw(st.sampled_from(SIZE_PATHS)), draw(st.sampled_from(HUGE)))
    if draw(st.booleans()):
        model = spec.get("model")
        block = model.get("block") if isinstance(model, dict) else None
        shared = block.get("mixer") if isinstance(block, dict) else None
        if isinstance(shared, dict):
            spec["model"]["layers"] = [{"select": "0", "mixer": shared}]  # the same object twice: &id001 / *id001
    return spec


SIZE_PATHS = [("model", "vocab_size"), ("model", "d_model"), ("model", "n_layers"), ("model", "context_length"),
              ("model", "block", "ffn", "hidden"), ("model", "block", "mixer", "n_heads"),
              ("model", "block", "mixer", "head_dim"), ("model", "pad_vocab_to_multiple")]
HUGE = [2**31, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 10**30, 10**400 // 10**300]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items() if v is not None) + " }"
    return '"null"'  # TOML has no null


def serialize(spec: dict, fmt: str) -> str:
    if fmt == "yaml":
        return yaml.safe_dump(spec, sort_keys=False, allow_unicode=True)
    if fmt == "json":
        return json.dumps(spec, indent=1)
    return "\n".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in spec.items() if v is not None) + "\n"


@st.composite
def spec_files(draw: Any) -> tuple[str, bytes]:
    """(file name, bytes): a document in one format, spliced with that format's features, maybe corrupted."""
    fmt = draw(st.sampled_from(["yaml", "json", "toml"]))
    text = serialize(draw(documents()), fmt)
    splices = {"yaml": YAML_VALUES, "json": JSON_VALUES, "toml": TOML_VALUES}[fmt]
    for _ in range(draw(st.integers(0, 3))):
        choice = draw(st.integers(0, 9))
        if choice <= 5:  # replace one number or name by a feature of the format
            targets = [t for t in ("32", "97", "48", "rope", "rmsnorm", "swiglu", "4", "2") if t in text]
            if targets:
                target = draw(st.sampled_from(targets))
                text = text.replace(target, draw(st.sampled_from(splices)), 1)
        elif choice == 6:  # nesting far deeper than any spec
            kind = "list" if fmt != "json" else draw(st.sampled_from(["list", "object"]))
            text = text.replace("97", nested(draw(st.sampled_from([10, 63, 65, 200, 5000, 100_000])), kind), 1)
        elif choice == 7 and fmt == "yaml":  # an alias bomb beside or instead of the spec
            text = bomb(draw(st.integers(1, 9)), draw(st.integers(1, 9))) + ("\nmodel: *a1\n" if draw(st.booleans()) else "\n" + text)
        elif choice == 8 and fmt == "yaml":  # merge key / several documents
            text = draw(st.sampled_from([
                "base: &b {vocab_size: 97, d_model: 32}\nmodel:\n  <<: *b\n  n_layers: 1\n  context_length: 8\n",
                text + "---\n" + text, "--- !!map\n" + text, "%YAML 1.1\n---\n" + text, "%TAG ! tag:x,2000:\n---\n" + text,
            ]))
        else:  # cut the text short
            text = text[: draw(st.integers(0, len(text)))]
    data = text.encode("utf-8", "surrogatepass")
    encoding = draw(st.integers(0, 9))  # 0 to 5: UTF-8 as written (hypothesis draws small numbers most)
    if encoding == 6:
        data = text.encode("utf-16")
    elif encoding == 7:
        data = b"\xef\xbb\xbf" + data  # a BOM, which is allowed
    elif encoding == 8:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=4)) + data[at:]
    elif encoding == 9:
        data = text.encode("latin-1", "replace") + "é".encode("latin-1")
    suffix = draw(st.sampled_from([f".{fmt}"] * 6 + [".yml", ".json", ".toml", ".yaml", ".txt", "", ".YAML"]))
    return f"{PREFIX}spec{suffix}", data


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    return sentinel(tmp_path_factory, "spec_files")


def _case(outside: Path, name: str, data: bytes) -> None:
    with case_dir(outside) as case:
        path = case.work / name
        path.write_bytes(data)
        loaded = expect_user_error(lambda: specformer.load_spec(path))
        validated = run_cli(["validate", str(path)])
        summary = run_cli(["summary", str(path)])
        valid = isinstance(loaded, specformer.Spec)
        event(f"load_spec: {outcome(loaded)}")
        assert (validated.code == 0) == valid, f"load_spec and validate disagree: {loaded!r}\n{validated.err}"
        assert (summary.code == 0) == valid, f"load_spec and summary disagree: {loaded!r}\n{summary.err}"
        if valid:
            event(f"build: {outcome(expect_user_error(lambda: specformer.build(loaded), allowed=(MemoryLimitError,)))}")


@FAST
@given(file=spec_files())
@example(file=(f"{PREFIX}spec.yaml", (bomb(9, 9) + "\nmodel: {vocab_size: *a9}\n").encode()))  # the alias bomb that hung validate
@example(file=(f"{PREFIX}spec.json", nested(100_000, "list").encode()))  # RecursionError before the depth bound
@example(file=(f"{PREFIX}spec.toml", ('"model" = ' + "[" * 5000 + "]" * 5000).encode()))
@example(file=(f"{PREFIX}spec.yaml", "model: {d_model: 1e9}\n".encode()))
@example(file=(f"{PREFIX}spec.yaml", yaml.safe_dump({"model": {**TINY["model"], "vocab_size": 2**64}}).encode()))  # TypeError in torch
@example(file=(f"{PREFIX}spec.yaml", b"model:\n  vocab_size: 9\xe9\n"))  # not UTF-8
@example(file=(f"{PREFIX}spec.yaml", b"!!python/object/apply:os.system ['touch fz-pwned']\n"))
@example(file=(f"{PREFIX}spec.yaml", b"model: {vocab_size: 97, d_model: !!float 1e!custom 300}\n"))  # a ValueError from PyYAML
@example(file=(f"{PREFIX}spec.yaml", b"model: {vocab_size: !!int x, d_model: 2001-13-45}\n"))
def test_any_spec_file(outside, file):
    _case(outside, *file)


@pytest.mark.slow
@SLOW
@given(file=spec_files())
def test_any_spec_file_many(outside, file):
    _case(outside, *file)


@pytest.mark.slow
def test_validating_a_huge_head_dim_takes_little_memory(outside):
    """``specformer validate`` of the tiny spec with ``d_model: 1e9`` in a fresh process: peak memory under 1 GiB."""
    import subprocess
    import sys

    with case_dir(outside) as case:
        path = case.work / f"{PREFIX}spec.yaml"
        path.write_text(yaml.safe_dump({"model": {**TINY["model"], "d_model": 1_000_000_000}}))
        script = ("import resource, sys; from specformer.cli.main import main; code = main(['validate', sys.argv[1]]); "
                  "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
        proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=300)
        assert "more than any machine can address" in proc.stderr
        assert int(proc.stdout.split()[-1]) < 1 << 30
