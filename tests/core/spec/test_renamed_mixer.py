"""Specs and checkpoints written when the block's token mixer was called `attention` keep loading as `mixer`.

The checkpoints under ``tests/fixtures/pre_mixer/`` were written by specformer before the
rename (``blocks.N.attention.*`` tensors, ``attention:`` in the stored spec), with the
logits their model gave (``expected.safetensors``).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import specformer
from specformer.checkpoint.file import read_metadata, read_tensors
from specformer.errors import CheckpointError, SpecError
from specformer.registry.components import call_with_sizes, construct
from specformer.renamed import RenamedWarning, current_name, current_patterns, forget_said, upgrade_spec

from conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "pre_mixer"

#: The model of the fixtures, written the way specs are written now.
SPEC = {"model": {"vocab_size": 32, "d_model": 16, "n_layers": 2, "context_length": 16, "positional": {"kind": "rope"},
                  "block": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1},
                            "ffn": {"kind": "swiglu", "hidden": 24}},
                  "layers": [{"select": [1], "mixer": {"kind": "short_conv", "kernel": 3}}]}}

OLD_YAML = """\
model:
  vocab_size: 32
  d_model: 16
  n_layers: 4
  context_length: 16
  positional: {kind: rope}
  block:
    norm: rmsnorm
    attention: {kind: attention, n_heads: 2, n_kv_heads: 1}
    ffn: {kind: swiglu, hidden: 24}
  layers:
    - {select: 1, attention: {kind: short_conv, kernel: 3}}
    - {select: 2, attention: {window: 4}}
    - {select: 3, attention: none}
"""


def renamed_lines(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, RenamedWarning)]


def test_an_old_spec_file_reads_as_mixer_with_one_line_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(OLD_YAML)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = specformer.load_spec(path)
    lines = renamed_lines(caught)
    assert len(lines) == 1, lines  # one line for the file, not one per layer written the old way
    assert str(path) in lines[0] and "'mixer'" in lines[0] and "model.block.attention (and 3 more)" in lines[0]
    assert spec.model.block.mixer.as_dict() == {"kind": "attention", "n_heads": 2, "n_kv_heads": 1}
    assert [o.mixer for o in spec.model.layers] == [{"kind": "short_conv", "kernel": 3}, {"window": 4}, "none"]
    # The same model as the spec written the new way, and the stored spec says mixer.
    new = OLD_YAML.replace("attention: {kind: attention", "mixer: {kind: attention").replace(
        "attention: {", "mixer: {").replace("attention: none", "mixer: none")
    (tmp_path / "new.yaml").write_text(new)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedWarning)
        assert specformer.load_spec(tmp_path / "new.yaml").to_json() == spec.to_json()
    assert '"attention":' not in spec.to_json().replace('"kind": "attention"', "")


def test_a_file_read_twice_in_one_process_is_said_once(tmp_path: Path) -> None:
    from specformer.cli.main import main

    path = tmp_path / "old.yaml"
    path.write_text(OLD_YAML)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["summary", str(path)]) == 0  # validates the spec, then sizes it from the file again
        specformer.load_spec(path)
    lines = renamed_lines(caught)
    assert len(lines) == 1 and str(path) in lines[0], lines


def test_both_keys_in_one_place_is_an_error_naming_both(tmp_path: Path) -> None:
    path = tmp_path / "both.yaml"
    path.write_text(OLD_YAML.replace("    ffn: {kind: swiglu", "    mixer: {kind: mamba2}\n    ffn: {kind: swiglu"))
    with pytest.raises(SpecError) as info:
        specformer.load_spec(path)
    [problem] = info.value.problems
    assert problem.path == "model.block" and "'attention'" in problem.message and "'mixer'" in problem.message
    assert str(path) in str(info.value)


def test_upgrading_leaves_the_data_alone_and_new_specs_silent() -> None:
    old = {"model": {"block": {"norm": "rmsnorm", "attention": "none", "ffn": "mlp"}, "layers": [{"select": 0}]}}
    with pytest.warns(RenamedWarning, match="a spec: model.block.attention: "):
        new = upgrade_spec(old)
    assert list(new["model"]["block"]) == ["norm", "mixer", "ffn"]  # the key where it was written
    assert "attention" in old["model"]["block"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedWarning)
        assert upgrade_spec(new) is new
        assert upgrade_spec(["not", "a", "spec"]) == ["not", "a", "spec"]


def test_old_tensor_names_and_globs_read_as_they_are_now() -> None:
    assert current_name("blocks.3.attention.qkv.weight") == "blocks.3.mixer.qkv.weight"
    assert current_name("blocks.3.attention_norm.weight") == "blocks.3.attention_norm.weight"  # the norm did not move
    assert current_name("blocks.0.mixer.mixers.1.qkv.weight") == "blocks.0.mixer.mixers.1.qkv.weight"
    with pytest.warns(RenamedWarning, match="lora targets: 'blocks.*.attention.qkv' is read as 'blocks.*.mixer.qkv'"):
        assert current_patterns(["blocks.*.ffn.*", "blocks.*.attention.qkv"], where="lora targets") == [
            "blocks.*.ffn.*", "blocks.*.mixer.qkv"]


def test_a_checkpoint_saved_before_the_rename_loads_and_gives_its_logits() -> None:
    expected = load_file(str(FIXTURES / "expected.safetensors"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = specformer.load(FIXTURES / "model.safetensors").eval()
    lines = renamed_lines(caught)
    assert len(lines) == 1 and "model.safetensors" in lines[0] and "'mixer'" in lines[0], lines
    assert old.spec.model.block.mixer.kind == "attention" and old.spec.model.layers[0].mixer["kind"] == "short_conv"
    with torch.no_grad():
        torch.testing.assert_close(old(expected["ids"]), expected["logits"], rtol=1e-5, atol=1e-6)  # saved on another CPU's kernels: close, not equal
    # The model built from the spec written the new way, given the stored tensors, is the same model.
    tensors = read_tensors(FIXTURES / "model.safetensors")
    assert "blocks.0.mixer.qkv.weight" in tensors and not any(".attention." in n for n in tensors)
    new = specformer.build(SPEC).eval()
    new.load_state_dict(tensors, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(new(expected["ids"]), expected["logits"], rtol=1e-5, atol=1e-6)  # saved on another CPU's kernels: close, not equal
    assert new.spec.to_json() == old.spec.to_json()


def test_a_saved_old_checkpoint_is_saved_the_new_way(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedWarning)
        model = specformer.load(FIXTURES / "model.safetensors")
    specformer.save(model, tmp_path / "now.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedWarning)  # nothing old left to say
        again = specformer.load(tmp_path / "now.safetensors")
    assert '"attention":' not in read_metadata(tmp_path / "now.safetensors")["spec"].replace(
        '"kind": "attention"', "")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_an_old_checkpoint_whose_stored_spec_has_both_keys_is_refused(tmp_path: Path) -> None:
    import json

    from safetensors.torch import save_file

    metadata = read_metadata(FIXTURES / "model.safetensors")
    spec = json.loads(metadata["spec"])
    spec["model"]["block"]["mixer"] = spec["model"]["block"]["attention"]
    save_file(read_tensors(FIXTURES / "model.safetensors"), str(tmp_path / "both.safetensors"),
              metadata={**metadata, "spec": json.dumps(spec)})
    with pytest.raises(CheckpointError, match=r"model.block: both 'attention' and 'mixer'"):
        specformer.load(tmp_path / "both.safetensors")


def test_a_layout_written_before_the_rename_is_handed_the_mixer_as_attention() -> None:
    """A third-party layout (or its size check) that takes ``attention=`` keeps working, with one line saying so."""
    forget_said()

    def old_layout(params, *, attention, ffn, d_model):
        return attention, ffn, d_model

    def old_check(*, attention, d_model):
        return attention

    with pytest.warns(RenamedWarning, match=r"old_layout: its attention= argument: .*now called 'mixer'"):
        assert construct(old_layout, None, mixer="M", ffn="F", d_model=8, make_norm=None) == ("M", "F", 8)
    with pytest.warns(RenamedWarning, match=r"old_check: its attention= argument"):
        assert call_with_sizes(old_check, mixer="S", d_model=8) == "S"

    def new_layout(params, *, mixer, d_model):
        return mixer

    def takes_everything(params, **sizes):
        return sorted(sizes)

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say for a layout written the new way
        assert construct(new_layout, None, mixer="M", d_model=8) == "M"
        assert construct(takes_everything, None, mixer="M", d_model=8) == ["d_model", "mixer"]
