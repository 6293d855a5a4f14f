"""A quantized checkpoint whose recipe names a scheme with bad params: one line per file, naming each field.

The recipe's ``scheme`` (and ``lm_head_scheme``) are validated by the scheme's own Params
model; a bad value is worded as in a spec (``quantization.scheme.group_size: Input should
be 32, 64 or 128 (got 7)``) on the line that names the file, never as pydantic's
multi-line text with its documentation link.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

import specformer
from specformer.cli.main import main
from specformer.errors import CheckpointError, SpecError
from specformer_quant.apply import scheme_from

from fixtures.one_line_errors import assert_each_refuses_in_one_line
from fixtures.tiny import tiny_spec

TINY = tiny_spec(vocab_size=259, d_model=64, n_layers=1,
                 block={"mixer": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1}, "ffn": {"kind": "swiglu", "hidden": 64}})


@pytest.fixture(scope="module")
def quantized(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("recipes")
    base = folder / "float.safetensors"
    specformer.save(specformer.build(TINY, seed=0), base, metadata={"tokenizer": json.dumps({"kind": "byte"})})
    out = {}
    for method in ("int8", "int4"):
        out[method] = folder / f"{method}.safetensors"
        assert main(["quantize", str(base), "--method", method, "-o", str(out[method])]) == 0
    return out


def with_recipe(source: Path, target: Path, **changes: object) -> Path:
    with safe_open(str(source), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        header = dict(f.metadata())
    header["quantization"] = json.dumps({**json.loads(header["quantization"]), **changes})
    save_file(tensors, str(target), metadata=header)
    return target


CASES = {
    "int4 group size": ("int4", {"scheme": {"kind": "int4", "group_size": 7}},
                        ["quantization.scheme.group_size: Input should be 32, 64 or 128 (got 7)"]),
    "int8 two problems": ("int8", {"scheme": {"kind": "int8", "dynamic_activations": "maybe", "bits": 8}},
                          ["quantization.scheme.dynamic_activations: Input should be a valid boolean",
                           "quantization.scheme.bits: unknown field; accepted: dynamic_activations"]),
    "scheme a number": ("int8", {"scheme": 8},
                        ["quantization.scheme: expected a component as a name or a mapping with 'kind', got 8"]),
    "head scheme": ("int8", {"lm_head_scheme": {"kind": "int4", "group_size": 1e300}},
                    ["quantization.lm_head_scheme.group_size: Input should be 32, 64 or 128"]),
    "unknown scheme": ("int4", {"scheme": "int3"}, ["quantization.scheme.kind: unknown quantization 'int3'"]),
}


@pytest.mark.parametrize("method, changes, expected", list(CASES.values()), ids=list(CASES))
def test_bad_scheme_params_in_the_recipe_are_one_line_naming_the_file_and_each_field(
        tmp_path: Path, quantized: dict[str, Path], capsys: pytest.CaptureFixture[str], method: str, changes: dict,
        expected: list[str]) -> None:
    bad = with_recipe(quantized[method], tmp_path / "bad.safetensors", **changes)
    with pytest.raises(CheckpointError) as info:
        specformer.load(bad)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{bad}: the quantization recipe in the header")
    assert all(part in message for part in expected), message
    (tmp_path / "notes.txt").write_text("the model reads tokens and predicts the next one\n" * 20)
    assert_each_refuses_in_one_line([["generate", str(bad), "--prompt", "a", "--max-new-tokens", "1"],
                                     ["summary", str(bad)], ["eval", str(bad), "--data", str(tmp_path / "notes.txt")]],
                                    message, capsys)


def test_a_scheme_given_in_python_is_a_spec_error_at_its_path() -> None:
    with pytest.raises(SpecError) as info:
        scheme_from({"kind": "int4", "group_size": 48}, path="--method")
    assert [str(p) for p in info.value.problems] == ["--method.group_size: Input should be 32, 64 or 128 (got 48)"]


@pytest.mark.parametrize("name", ["\x1e", "blocks.0.ffn.down\nblocks.1", "blocks..0", 7])
def test_a_listed_layer_that_is_no_layer_name_is_refused_in_one_line(tmp_path: Path, quantized: dict[str, Path],
                                                                       capsys: pytest.CaptureFixture[str], name) -> None:
    """The recipe is untrusted input: a name with a record separator or a line break is shown escaped, once."""
    recipe = json.loads(read_metadata_of(quantized["int4"])["quantization"])
    bad = with_recipe(quantized["int4"], tmp_path / "bad.safetensors", linears=[name, *recipe["linears"][1:]])
    with pytest.raises(CheckpointError) as info:
        specformer.load(bad)
    message = str(info.value)
    assert len(message.splitlines()) == 1 and "'linears' lists" in message and "not a layer name" in message, message
    assert_each_refuses_in_one_line([["generate", str(bad), "--prompt", "a", "--max-new-tokens", "1"],
                                     ["summary", str(bad)]], message, capsys)


def read_metadata_of(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="pt") as f:
        return dict(f.metadata())
