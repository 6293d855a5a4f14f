"""tools/mutation.py: stable mutant ids, and its table of equivalent mutants kept in step with the code and docs."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("specformer_mutation_tool", REPO / "tools" / "mutation.py")
mutation = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = mutation  # its dataclasses look their module up there
_spec.loader.exec_module(mutation)

ORIGINAL = '''
def pick(step, warmup, lr):
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    x = torch.full((2,), -1, dtype=torch.long)
    y = torch.full((2,), -1, dtype=torch.long)
    return x
'''
# The same function laid out otherwise: other line breaks, quotes, spacing, a comment and a new statement.
REFORMATTED = '''
def pick(step, warmup, lr):
    # warm-up first
    if (step
            < warmup):
        return lr*(step+1)/(warmup+1)
    print("unrelated")
    x = torch.full(
        (2,), -1, dtype=torch.long,
    )
    y = torch.full((2,),-1,dtype=torch.long)
    return x
'''


def ids(source: str, mutate) -> str:
    original = ast.parse(source).body[0]
    mutant = ast.parse(source).body[0]
    mutate(mutant)
    return mutation.stable_id("m.py", "pick", original, mutant)


def flip_compare(function: ast.FunctionDef) -> None:
    next(n for n in ast.walk(function) if isinstance(n, ast.Compare)).ops = [ast.LtE()]


def drop_dtype_of_second(function: ast.FunctionDef) -> None:
    calls = [n for n in ast.walk(function) if isinstance(n, ast.Call) and ast.unparse(n.func) == "torch.full"]
    calls[1].keywords = []


def test_an_id_names_the_function_and_the_changed_statement_and_ignores_layout() -> None:
    assert ids(ORIGINAL, flip_compare) == "m.py::pick::step < warmup -> step <= warmup"
    assert ids(REFORMATTED, flip_compare) == ids(ORIGINAL, flip_compare)


def test_equal_statements_are_told_apart_by_their_occurrence() -> None:
    second = "m.py::pick::y = torch.full((2,), -1, dtype=torch.long) -> y = torch.full((2,), -1)"
    assert ids(ORIGINAL, drop_dtype_of_second) == second
    assert ids(REFORMATTED, drop_dtype_of_second) == second
    repeated = ORIGINAL.replace("y = torch.full", "x = torch.full")
    assert ids(repeated, drop_dtype_of_second).endswith("x = torch.full((2,), -1) #1")


def test_every_equivalent_mutant_still_exists_in_the_code() -> None:
    # A changed statement or a renamed function retires an id: its mutant then shows as a survivor again.
    assert mutation.stale_entries() == []


def test_the_docs_list_the_modules_of_the_table() -> None:
    mutants, patterns = mutation.load_equivalents()
    modules = {key.split("::", 1)[0] for key in mutants} | {p["module_prefix"] for p in patterns if p["module_prefix"]}
    page = (REPO / "docs" / "testing.md").read_text(encoding="utf-8")
    table = page[page.index("### Equivalent mutants"):]
    rows = re.findall(r"^\| ((?:`[\w/.]+`(?:, )?)+) \|", table, re.MULTILINE)  # the Module column
    named = {name for row in rows for name in re.findall(r"`([\w/.]+(?:\.py|/))`", row)}
    for module in modules:
        assert any(module.endswith(name) for name in named), f"{module} has equivalent mutants but no row in docs"
    for name in named:
        assert any(m.endswith(name) for m in modules), f"docs list {name}, which has no equivalent mutant"
    json.loads((REPO / "tools" / "mutation_equivalents.json").read_text(encoding="utf-8"))
