"""Shared fixtures: tiny random transformers models saved to disk, imported once per test module."""

from __future__ import annotations

import importlib.util
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers", reason="transformers is a test-only dependency of the hf plugin")


def _load(name: str) -> Any:
    # Registered by name rather than by putting this directory on sys.path, where this
    # conftest would shadow the top-level one other test modules import.
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


_cases = _load("hf_cases")
_load("hf_forge")  # folders forged by hand: test modules `import hf_forge`
_load("multimodal")  # a multimodal checkpoint read for its language model: `from multimodal import ...`
BY_NAME, CASES, Case = _cases.BY_NAME, _cases.CASES, _cases.Case


@dataclass
class Saved:
    """A transformers model, the directory it was saved to, and what specformer imported from it."""

    case: Case
    hf: Any
    directory: Path
    imported: Any

    @property
    def model(self) -> Any:
        return self.imported.model


def save_and_import(case: Case, directory: Path) -> Saved:
    import specformer_hf

    hf = case.build()
    case.save(hf, directory)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")  # these folders have none, on purpose
        imported = specformer_hf.import_hf(directory)
    return Saved(case=case, hf=hf, directory=directory, imported=imported)


@pytest.fixture(scope="module", params=[pytest.param(c.name, marks=[pytest.mark.slow] if c.name in _cases.SLOW_VARIANTS else [])
                                        for c in CASES])
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Saved:
    case = BY_NAME[request.param]
    return save_and_import(case, tmp_path_factory.mktemp(case.name))




def _saved_case(name: str):
    @pytest.fixture(scope="module")
    def fixture(tmp_path_factory: pytest.TempPathFactory) -> Saved:
        return save_and_import(BY_NAME[name], tmp_path_factory.mktemp(name))

    return fixture


#: A small Llama, for tests that break its files in various ways (copy it first).
llama_dir = _saved_case("llama")
saved_gpt2 = _saved_case("gpt2")
saved_neox = _saved_case("gpt_neox")
saved_gemma = _saved_case("gemma")
saved_phi3 = _saved_case("phi3")
saved_qwen2 = _saved_case("qwen2")
saved_rope_dynamic = _saved_case("llama-rope-dynamic")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The folders made here have no tokenizer.json on purpose; the warning saying so is tested where it matters.
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.filterwarnings("ignore:.*has no tokenizer.json"))
