"""An adapter checkpoint whose header entry holds bad adapter params: one line per file, naming each field.

The ``adapter`` entry's component (``{"kind": "lora", "rank": ...}``) is validated by the
adapter's own Params model; a bad value is worded as in a spec
(``adapter.rank: Input should be less than or equal to 4096 (got 1000000000)``), on the
line that names the file, never as pydantic's multi-line text with its documentation link.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.errors import CheckpointError
from specformer_finetune.adapter_file import base_reference, save_adapter
from specformer_finetune.apply import apply_adapter

from fixtures.one_line_errors import assert_each_refuses_in_one_line

LORA = {"kind": "lora", "rank": 4, "alpha": 8, "targets": ["blocks.*.mixer.qkv"]}


@pytest.fixture
def adapter_ckpt(tmp_path: Path, base_ckpt: Path) -> Path:
    model = specformer.load(base_ckpt)
    apply_adapter(model, LORA).base = base_reference(base_ckpt)
    path = tmp_path / "adapter.safetensors"
    save_adapter(model, path)
    return path


def with_params(source: Path, target: Path, **params: object) -> Path:
    """``source`` with the adapter component in its header changed (a key set to ... is dropped)."""
    with safe_open(str(source), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        header = dict(f.metadata())
    record = json.loads(header["adapter"])
    record["adapter"].update(params)
    record["adapter"] = {k: v for k, v in record["adapter"].items() if v is not ...}
    header["adapter"] = json.dumps(record)
    save_file(tensors, str(target), metadata=header)
    return target


CASES = {
    "rank too large": ({"rank": 1_000_000_000}, ["adapter.rank: Input should be less than or equal to 4096 (got 1000000000)"]),
    "rank a string": ({"rank": "eight"}, ["adapter.rank: Input should be a valid integer"]),
    "unknown field": ({"rnak": 4}, ["adapter.rnak: unknown field; did you mean 'rank'?"]),
    "bad base scheme": ({"base": {"kind": "int4", "group_size": 7}}, ["adapter.base.group_size: Input should be 32, 64 or 128 (got 7)"]),
    "two problems": ({"alpha": -1, "dropout": 2}, ["adapter.alpha: Input should be greater than 0 (got -1)",
                                                   "adapter.dropout: Input should be less than 1 (got 2)"]),
    "unknown kind": ({"kind": "lora2"}, ["adapter.kind: unknown adapter 'lora2'; did you mean 'lora'?"]),
}


@pytest.mark.parametrize("params, expected", list(CASES.values()), ids=list(CASES))
def test_bad_adapter_params_in_the_header_are_one_line_naming_the_file_and_each_field(
        tmp_path: Path, adapter_ckpt: Path, capsys: pytest.CaptureFixture[str], params: dict, expected: list[str]) -> None:
    bad = with_params(adapter_ckpt, tmp_path / "bad.safetensors", **params)
    with pytest.raises(CheckpointError) as info:
        specformer.load(bad)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{bad}: the adapter entry in the header")
    assert all(part in message for part in expected), message
    (tmp_path / "notes.txt").write_text("the model reads tokens and predicts the next one\n" * 20)
    assert_each_refuses_in_one_line([["generate", str(bad), "--prompt", "a", "--max-new-tokens", "1"],
                                     ["summary", str(bad)], ["merge", str(bad), "-o", str(tmp_path / "merged.safetensors")],
                                     ["eval", str(bad), "--data", str(tmp_path / "notes.txt")]], message, capsys)
    assert not (tmp_path / "merged.safetensors").exists()


def test_the_params_are_checked_again_where_the_adapter_is_applied(tmp_path: Path, adapter_ckpt: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading applies the record's component itself: were the header check skipped, its error is one line too."""
    from specformer_finetune import adapter_file

    bad = with_params(adapter_ckpt, tmp_path / "bad.safetensors", rank=0)
    monkeypatch.setattr(adapter_file, "resolve_adapter", lambda ref, *, path: None)  # the header check, skipped
    checked = SimpleNamespace(path=bad, metadata=read_metadata(bad))
    with pytest.raises(CheckpointError) as info:
        adapter_file.load_adapted(checked, "cpu", verify=False)
    message = str(info.value)
    assert "\n" not in message and "errors.pydantic.dev" not in message
    assert message.startswith(f"{bad}: the adapter cannot be applied to its base: adapter.rank: "
                              "Input should be greater than 0 (got 0)"), message


@pytest.mark.parametrize("name", ["\x1e", "blocks.0.mixer.qkv\u2028x", ""])
def test_a_target_that_is_no_layer_name_is_refused_in_one_line(tmp_path: Path, adapter_ckpt: Path,
                                                                 capsys: pytest.CaptureFixture[str], name: str) -> None:
    """The targets are untrusted input: a name with a record separator or a line break is shown escaped, once."""
    with safe_open(str(adapter_ckpt), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        header = dict(f.metadata())
    record = json.loads(header["adapter"])
    record["targets"] = [name, *record["targets"][1:]]
    header["adapter"] = json.dumps(record)
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata=header)
    with pytest.raises(CheckpointError) as info:
        specformer.load(bad)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "'targets' lists" in message and "not a layer name" in message, message
    assert_each_refuses_in_one_line([["summary", str(bad)]], message, capsys)
