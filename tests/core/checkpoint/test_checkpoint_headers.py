"""Untrusted checkpoints: forged headers are refused by their own contents, before any allocation."""

from __future__ import annotations

import copy
import json
import time

import pytest
import torch
from safetensors.torch import save_file

import specformer
from specformer.checkpoint.save_load import FORMAT, read_metadata, read_tensors
from specformer.checkpoint.check import check_checkpoint
from specformer.cli.main import main
from specformer.errors import CheckpointError, MemoryLimitError

from conftest import TINY


@pytest.fixture
def saved(tmp_path):
    model = specformer.build(TINY, seed=0)
    return specformer.save(model, tmp_path / "tiny.safetensors")


def forge(tmp_path, saved, *, name="forged.safetensors", tensors=None, **header):
    """A copy of ``saved`` with header entries replaced (None removes one) and optionally other tensors."""
    metadata = dict(read_metadata(saved))
    for key, value in header.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    path = tmp_path / name
    save_file(tensors if tensors is not None else read_tensors(saved), str(path), metadata=metadata)
    return path


def _load_and_summary_refuse(path, match, capsys):
    with pytest.raises(CheckpointError, match=match):
        specformer.load(path)
    assert main(["summary", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(path) in err
    return err


@pytest.mark.parametrize("spec_text, kind", [
    ("[1, 2, 3]", "a JSON list"), ("42", "a JSON number"), ('"specs/tiny.yaml"', "a JSON string"),
    ("null", "a JSON null"), ("true", "a JSON boolean"),
])
def test_a_spec_that_is_not_a_mapping_is_refused(tmp_path, saved, spec_text, kind, capsys):
    err = _load_and_summary_refuse(forge(tmp_path, saved, spec=spec_text), kind, capsys)
    assert "described only by its own header" in err


def test_a_string_spec_is_never_read_as_a_path(tmp_path, saved, monkeypatch, capsys):
    """The header names a real spec file on this disk: it must still be refused, not loaded from there."""
    other = tmp_path / "elsewhere.json"
    other.write_text(json.dumps(TINY))
    monkeypatch.chdir(tmp_path)
    path = forge(tmp_path, saved, spec=json.dumps(str(other)))
    _load_and_summary_refuse(path, "a JSON string", capsys)
    path = forge(tmp_path, saved, name="rel.safetensors", spec=json.dumps("elsewhere.json"))
    _load_and_summary_refuse(path, "a JSON string", capsys)


def test_invalid_json_spec(tmp_path, saved, capsys):
    _load_and_summary_refuse(forge(tmp_path, saved, spec="{model: nope"), "not valid JSON", capsys)


def test_deeply_nested_spec_in_the_header(tmp_path, saved, capsys):
    _load_and_summary_refuse(forge(tmp_path, saved, spec="[" * 100_000 + "]" * 100_000), "nested", capsys)


def test_missing_spec_says_so(tmp_path, saved, capsys):
    err = _load_and_summary_refuse(forge(tmp_path, saved, spec=None), "without its 'spec' entry", capsys)
    assert "expected format" not in err


@pytest.mark.parametrize("tag", ["other-tool/1", "specformer-checkpoint/2", "", "specformer-checkpoint/1 "])
def test_the_format_tag_is_checked(tmp_path, saved, tag, capsys):
    """Issue 20's survivor: a loader that stops checking the tag must fail this test."""
    err = _load_and_summary_refuse(forge(tmp_path, saved, format=tag), "not a specformer checkpoint", capsys)
    assert repr(FORMAT) in err


def test_no_format_tag(tmp_path, saved, capsys):
    _load_and_summary_refuse(forge(tmp_path, saved, format=None), "no 'format' entry", capsys)


def test_a_small_file_claiming_a_huge_model_is_refused_quickly(tmp_path, saved, monkeypatch, capsys):
    """A 30B-parameter spec over the tiny weights: refused from the header alone, nothing allocated."""
    huge = copy.deepcopy(TINY)
    huge["model"].update(vocab_size=152064, d_model=8192, n_layers=48)
    huge["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 64, "n_kv_heads": 8}
    huge["model"]["block"]["ffn"] = {"kind": "swiglu", "hidden": 29568}
    assert specformer.summarize(huge).total > 25e9
    path = forge(tmp_path, saved, spec=json.dumps(huge))
    allocations = []
    monkeypatch.setattr(specformer.model.builder, "assemble", lambda *a, **k: allocations.append(1))
    start = time.monotonic()
    err = _load_and_summary_refuse(path, "does not match its spec", capsys)
    assert time.monotonic() - start < 20 and not allocations
    assert "parameters" in err


def test_matching_names_with_wrong_shapes_are_refused_before_building(tmp_path, saved, monkeypatch, capsys):
    tensors = read_tensors(saved)
    tensors["blocks.0.ffn.up.weight" if "blocks.0.ffn.up.weight" in tensors else next(iter(tensors))] = torch.zeros(3, 3)
    path = forge(tmp_path, saved, tensors=tensors)
    monkeypatch.setattr(specformer.model.builder, "assemble", lambda *a, **k: pytest.fail("built before checking"))
    _load_and_summary_refuse(path, "mis-shaped tensors", capsys)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_integer_or_bool_weights_are_refused(tmp_path, saved, dtype, capsys):
    tensors = read_tensors(saved)
    name = "final_norm.weight"
    tensors[name] = tensors[name].to(dtype)
    err = _load_and_summary_refuse(forge(tmp_path, saved, tensors=tensors), "not floating point", capsys)
    assert name in err


def test_load_weights_refuses_integer_tensors_too():
    from specformer.checkpoint.save_load import load_weights

    model = specformer.build(TINY, seed=0)
    tensors = {k: v.clone() for k, v in model.state_dict().items()}
    tensors["final_norm.weight"] = tensors["final_norm.weight"].to(torch.int64)
    with pytest.raises(CheckpointError, match="not floating point"):
        load_weights(model, tensors, where="x")


def test_a_good_checkpoint_passes_the_check(saved):
    checked = check_checkpoint(saved)
    assert checked.shape.parameters == sum(p.numel() for p in specformer.load(saved).parameters())
    assert checked.tensor_bytes == saved.stat().st_size - 8 - int.from_bytes(saved.read_bytes()[:8], "little")


def test_load_refuses_a_model_larger_than_the_memory_limit(saved, monkeypatch):
    monkeypatch.setenv("SPECFORMER_MAX_MEMORY", "1K")
    with pytest.raises(MemoryLimitError) as info:
        specformer.load(saved)
    assert "SPECFORMER_MAX_MEMORY" in str(info.value) and "bytes" in str(info.value)
    monkeypatch.setenv("SPECFORMER_MAX_MEMORY", "unlimited")
    specformer.load(saved)


def test_a_directory_or_pipe_given_as_checkpoint_says_what_it_is(tmp_path):
    import os

    with pytest.raises(CheckpointError, match="a directory without a checkpoint"):
        specformer.load(tmp_path)
    fifo = tmp_path / "x.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(CheckpointError, match="a pipe, not a checkpoint file"):
        specformer.load(fifo)
