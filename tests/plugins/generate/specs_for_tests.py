"""Example specs, shrunk when they are too big to run in a unit test, and one spec per component."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from specformer.spec import layer_selection, read_spec_file
from fixtures.small_parts import run_shared_blocks, small_mixers
from fixtures.tiny import tiny_spec

SPEC_DIR = Path(__file__).resolve().parents[3] / "specs"
SPEC_FILES = sorted(p for p in SPEC_DIR.iterdir() if p.suffix in (".yaml", ".yml", ".json", ".toml"))

#: Example specs whose mixers another example already exercises in the default suite (one per mixer stays:
#: qwen3.5-9b, kimi-linear, mamba-codestral, lfm2, falcon-h1), and mixture-of-experts attention models whose
#: parts other examples run by default (GLM-4.5-Air, MiniMax-M2: deepseek-v3's sigmoid router, pythia's partial
#: rope, olmo-2's q/k norm over all heads), and DeepSeek-V4 (its compressed attention, hyper-connections and
#: routers go through the cache in their own tests and the component contract): the tests that build every spec
#: run them slow.
SLOW_SPECS = frozenset({"deepseek-v4.yaml", "qwen3-next-80b-a3b.yaml", "qwen3.5-35b-a3b.yaml", "olmo-hybrid-7b.yaml", "nemotron-h-8b.yaml",
                        "granite-4.0-h-tiny.yaml", "glm-4.5-air.yaml", "minimax-m2.yaml"})


def spec_features(data: Any, path: str = "") -> set[str]:
    """What a spec asks of the code, sizes left out: each component kind by where it sits
    (``.model.block.mixer=attention``), each flag and word by its key and value
    (``.model.block.mixer.qk_norm=True``), and each number by its key alone."""
    found: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "select":  # which layers an override picks is a size, not a mechanism
                continue
            if key == "kind":
                found.add(f"{path}={value}")
            elif isinstance(value, (dict, list)):
                found |= spec_features(value, f"{path}.{key}")
            elif isinstance(value, (bool, str)) or value is None:
                found.add(f"{path}.{key}={value}")
            else:
                found.add(f"{path}.{key}")
    elif isinstance(data, list):
        for value in data:
            found |= spec_features(value, f"{path}[]")
    return found


def repeated_specs() -> set[str]:
    """The example specs that ask nothing of the code the default suite's other examples do not.

    Specs are taken from the fewest features up (ties by name), and one runs by default when it
    has a feature no spec taken before it has; the others add only sizes, and run with the
    slow tests (CI runs both). A new mechanism in a spec therefore always reaches the default suite.
    A spec's features are read from its file as written; what it covers for the specs after it,
    from its shrunk form (which may drop its layer overrides), so shrinking hides nothing.
    (Not :func:`spec_data`: deciding whether to shrink builds a summary, seconds for all of them.)
    """
    covered: set[str] = set()
    repeated: set[str] = set()
    written = {path.name: {"model": read_spec_file(path)["model"]} for path in SPEC_FILES if path.name not in SLOW_SPECS}
    features = {name: spec_features(data) for name, data in written.items()}
    for name in sorted(features, key=lambda n: (len(features[n]), n)):
        if features[name] <= covered:
            repeated.add(name)
        covered |= features[name] & spec_features(small_version(written[name]))
    return repeated


def example_specs() -> list[Any]:
    """SPEC_FILES as pytest params, those in SLOW_SPECS or :func:`repeated_specs` marked slow."""
    import pytest

    assert SLOW_SPECS <= {p.name for p in SPEC_FILES}, sorted(SLOW_SPECS - {p.name for p in SPEC_FILES})
    slow = SLOW_SPECS | repeated_specs()
    return [pytest.param(p, id=p.name, marks=[pytest.mark.slow] if p.name in slow else []) for p in SPEC_FILES]

#: Above this many parameters a spec is built at a reduced size (its components unchanged).
MAX_PARAMS = 4_000_000


def small_version(data: dict[str, Any]) -> dict[str, Any]:
    """The same architecture (components, layout, overrides) at test size."""
    data = copy.deepcopy(data)
    model = data["model"]
    model["vocab_size"] = min(model["vocab_size"], 300)
    model["d_model"] = 64
    model["n_layers"] = min(model["n_layers"], 6)  # six keep every-fourth / every-sixth layer patterns (Gemma 3, SmolLM3)
    model["context_length"] = min(model["context_length"], 128)
    small_mixers(model)
    ffn = model["block"]["ffn"]
    if isinstance(ffn, dict) and ffn.get("hidden") is not None:
        ffn["hidden"] = 128
    model.pop("layers", None) if any(_selects_missing(o, model["n_layers"]) for o in model.get("layers", [])) else None
    run_shared_blocks(model)
    return data


def _selects_missing(override: dict[str, Any], n_layers: int) -> bool:
    """True when the override names a layer the smaller model does not have, or selects none of its layers."""
    try:
        return not layer_selection(override.get("select"), n_layers)
    except ValueError:
        return True


def spec_data(path: Path) -> dict[str, Any]:
    from specformer import summarize

    data = read_spec_file(path)
    data = {"model": data["model"]}  # train/generate sections are other tests' business
    return small_version(data) if summarize(data).total > MAX_PARAMS else data


#: Block parts ``tiny_with`` places in the block; every other change is a model field.
BLOCK_PARTS = ("layout", "norm", "mixer", "ffn")


def tiny_with(**changes: Any) -> dict[str, Any]:
    """The shared tiny spec over 61 ids, context 64, with model fields (``positional=...``) or block
    parts (``layout=...``) replaced.

    Untied head and a wide init: a random model with tied embeddings and init 0.02 greedily
    repeats the last prompt token, which makes token comparisons pass for wrong code.
    """
    block = {"ffn": {"kind": "swiglu", "hidden": 64}}
    block.update({part: changes.pop(part) for part in BLOCK_PARTS if part in changes})
    model = {"vocab_size": 61, "context_length": 64, "tie_embeddings": False, "init_std": 0.4, **changes}
    return tiny_spec(block=block, **model)


TINY: dict[str, Any] = tiny_with()


def assert_not_degenerate(rows: Any, prompts: Any) -> None:
    """Each continuation must vary: at least 3 distinct tokens, not just the last prompt token repeated.

    Token comparisons (against transformers, alone vs batched, cache vs recompute) only
    mean something when the model's output depends on what it reads.
    """
    rows = rows.tolist() if hasattr(rows, "tolist") else rows
    prompts = prompts.tolist() if hasattr(prompts, "tolist") else prompts
    for row, prompt in zip(rows, prompts):
        new = row[len(prompt):]
        assert len(set(new)) >= min(3, len(new)), f"degenerate continuation {new} of {prompt}"
