"""Property-based: any Hugging Face folder ends in a model or one clear UserError, within bounds.

Folders are forged from a valid one-layer Llama (safetensors + JSON) and then broken by
hypothesis: config values replaced by anything JSON can hold (huge, negative, wrong
type, missing), another ``model_type``, index entries pointing anywhere, tensors of the
wrong dtype or shape. Invariant for every case: ``import_hf`` returns a model or raises
``UserError`` (nothing else), within a time bound, without a jump in peak memory, and
nothing outside the case's own folder changes (or is followed: a good shard planted
outside the folder must never be what an import reads).

The default suite runs a few dozen cases per target (derandomized, so always the same);
``-m slow`` runs 1000 per target.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from pathlib import Path
from typing import Any

import hf_forge
from fuzz.harness import bounded, peak_rss_bytes, snapshot
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import specformer_hf
from specformer.errors import UserError

#: Seconds one case may take (a tiny model: a hang or a huge allocation shows as far more).
TIME_LIMIT_S = 60
#: Growth of the process' peak resident memory one case may cause.
MEMORY_LIMIT_BYTES = 1 << 30

FAST = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(FAST, max_examples=1000)

FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo2", "gpt2", "gpt_neox", "mixtral"]

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-3, 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)


@st.composite
def configs(draw: Any) -> Any:
    config = hf_forge.llama_config()
    if draw(st.integers(0, 9)) == 0:
        return draw(json_values)  # not even an object
    if draw(st.booleans()):
        config["model_type"] = draw(st.one_of(st.sampled_from(FAMILIES), json_scalars))
    keys = sorted(config) + ["rope_parameters", "layer_types", "sliding_window", "use_sliding_window", "head_dim",
                             "attention_bias", "tie_word_embeddings", "hidden_act", "max_window_layers"]
    for key in draw(st.lists(st.sampled_from(keys), max_size=4, unique=True)):
        if draw(st.integers(0, 3)) == 0:
            config.pop(key, None)
        else:
            config[key] = draw(json_values)
    return config


def _weights() -> dict[str, torch.Tensor]:
    return hf_forge.llama_tensors(hf_forge.llama_config())


@st.composite
def tensor_edits(draw: Any) -> list[tuple[str, str, Any]]:
    """Edits to the valid tensors as (name, change, argument): small to print when a case fails."""
    names = sorted(_weights())
    edits = []
    for name in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
        change = draw(st.sampled_from(["drop", "dtype", "shape", "rename"]))
        argument = {
            "drop": st.none(),
            "dtype": st.sampled_from(["int64", "int32", "uint8", "bool", "float16", "bfloat16", "float64"]),
            "shape": st.lists(st.integers(0, 40), max_size=3),
            "rename": st.text(min_size=1, max_size=20),
        }[change]
        edits.append((name, change, draw(argument)))
    return edits


def _edited(edits: list[tuple[str, str, Any]]) -> dict[str, torch.Tensor]:
    tensors = _weights()
    for name, change, argument in edits:
        if change == "drop":
            del tensors[name]
        elif change == "dtype":
            tensors[name] = tensors[name].to(getattr(torch, argument))
        elif change == "shape":
            tensors[name] = torch.zeros(argument)
        else:
            tensors[argument] = tensors.pop(name)
    return tensors


shard_names = st.one_of(
    st.sampled_from(["a.safetensors", "b.safetensors", "../outside.safetensors", "/etc/passwd", "", ".", "..",
                     "sub/../a.safetensors", "a.safetensors/..", "missing.safetensors", "config.json", "\\..\\x"]),
    st.text(max_size=20), json_scalars,
)


@st.composite
def weight_maps(draw: Any) -> Any:
    names = sorted(_weights())
    correct = {n: ("a.safetensors" if i % 2 else "b.safetensors") for i, n in enumerate(names)}
    shape = draw(st.integers(0, 5))
    if shape == 0:
        return draw(json_values)
    forged = dict(correct)
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=4, unique=True)):
        forged[name] = draw(shard_names)
    if draw(st.booleans()):
        forged[draw(st.text(max_size=10))] = draw(shard_names)
    return forged


def _import_within_bounds(folder: Path, outside: Path) -> None:
    """The invariant: a model or a UserError, in time and memory; the files outside ``folder`` untouched."""
    before_rss, before_files = peak_rss_bytes(), snapshot(outside)
    with bounded(TIME_LIMIT_S), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unread config fields and the missing tokenizer warn; that is allowed
        try:
            specformer_hf.import_hf(folder)
        except UserError as exc:
            assert str(exc).strip(), "an error without a message"
    assert peak_rss_bytes() - before_rss < MEMORY_LIMIT_BYTES
    assert snapshot(outside) == before_files


def _case(write) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        outside = root / "outside"
        outside.mkdir()
        # A valid shard outside the model folder: an import that follows "../outside.safetensors" would read it.
        save_file(_weights(), str(outside / "outside.safetensors"))
        folder = root / "model"
        folder.mkdir()
        write(folder)
        _import_within_bounds(folder, outside)


def _config_case(config: Any, edits: list[tuple[str, str, Any]]) -> None:
    tensors = _edited(edits)

    def write(folder: Path) -> None:
        (folder / "config.json").write_text(json.dumps(config))
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})

    _case(write)


def _index_case(weight_map: Any) -> None:
    def write(folder: Path) -> None:
        (folder / "config.json").write_text(json.dumps(hf_forge.llama_config()))
        tensors = _weights()
        names = sorted(tensors)
        for shard, part in (("a.safetensors", names[1::2]), ("b.safetensors", names[0::2])):
            save_file({n: tensors[n] for n in part}, str(folder / shard), metadata={"format": "pt"})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))

    _case(write)


@FAST
@given(config=configs(), edits=tensor_edits())
def test_any_config_and_tensors(config, edits):
    _config_case(config, edits)


@FAST
@given(weight_map=weight_maps())
def test_any_shard_index(weight_map):
    _index_case(weight_map)


@pytest.mark.slow
@SLOW
@given(config=configs(), edits=tensor_edits())
def test_any_config_and_tensors_many(config, edits):
    _config_case(config, edits)


@pytest.mark.slow
@SLOW
@given(weight_map=weight_maps())
def test_any_shard_index_many(weight_map):
    _index_case(weight_map)
