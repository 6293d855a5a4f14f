"""Spec loading and validation: every problem reported at its path, with what is accepted."""

from __future__ import annotations

import json

import pytest
import yaml

import specformer
from specformer.errors import SpecError
from specformer.spec import select_layers


def problems(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    return [str(p) for p in info.value.problems]


def test_valid_spec_loads_with_defaults(fresh_tiny_spec):
    spec = specformer.load_spec(fresh_tiny_spec)
    assert spec.model.block.layout.kind == "prenorm"
    assert spec.model.tie_embeddings is True
    assert spec.model.final_norm_ref() == {"kind": "rmsnorm"}


def test_same_spec_in_yaml_json_and_toml(tmp_path, fresh_tiny_spec):
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(fresh_tiny_spec))
    (tmp_path / "m.json").write_text(json.dumps(fresh_tiny_spec))
    m = fresh_tiny_spec["model"]
    toml = (
        f"[model]\nvocab_size = {m['vocab_size']}\nd_model = {m['d_model']}\nn_layers = {m['n_layers']}\n"
        f"context_length = {m['context_length']}\npositional = {{ kind = \"rope\" }}\n"
        "[model.block]\nnorm = \"rmsnorm\"\nmixer = { kind = \"attention\", n_heads = 4, n_kv_heads = 2 }\n"
        "ffn = { kind = \"swiglu\", hidden = 48 }\n"
    )
    (tmp_path / "m.toml").write_text(toml)
    loaded = [specformer.load_spec(tmp_path / f"m.{ext}").to_dict() for ext in ("yaml", "json", "toml")]
    assert loaded[0] == loaded[1] == loaded[2]


def test_unknown_kind_lists_registered_names_and_closest_match(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["norm"] = "rmsnrom"
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.block.norm.kind: unknown norm 'rmsnrom'")
    assert "did you mean 'rmsnorm'?" in msg
    assert "layernorm" in msg and "rmsnorm" in msg


def test_bad_param_names_path_value_and_constraint(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"]["n_kv_heads"] = 3
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.block.mixer")
    assert "n_kv_heads (3) must divide n_heads (4)" in msg


def test_negative_size_is_reported_with_value(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"]["n_heads"] = -1
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.block.mixer.n_heads:")
    assert "greater than 0" in msg and "-1" in msg


def test_unknown_param_lists_accepted_fields(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"]["n_head"] = 4
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.block.mixer.n_head: unknown field; did you mean 'n_heads'? accepted:")
    assert "n_heads" in msg and "n_kv_heads" in msg


def test_unknown_model_field_lists_accepted_fields(fresh_tiny_spec):
    fresh_tiny_spec["model"]["dmodel"] = 3
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.dmodel: unknown field; did you mean 'd_model'? accepted:") and "d_model" in msg


def test_missing_required_field(fresh_tiny_spec):
    del fresh_tiny_spec["model"]["d_model"]
    assert problems(fresh_tiny_spec) == ["model.d_model: required field is missing"]


def test_every_problem_is_reported_at_once(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["norm"] = "nope"
    fresh_tiny_spec["model"]["block"]["ffn"] = {"kind": "swiglu", "hidden": 0}
    fresh_tiny_spec["model"]["positional"] = {"kind": "rope", "theta": -1}
    paths = sorted(p.split(":")[0] for p in problems(fresh_tiny_spec))
    assert paths == ["model.block.ffn.hidden", "model.block.norm.kind", "model.positional.theta"]


def test_size_constraints_are_checked_by_components(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 5}
    [msg] = problems(fresh_tiny_spec)
    assert msg == "model.block.mixer: n_heads (5) must divide d_model (32) unless head_dim is given"


def test_unknown_section_lists_accepted_sections(fresh_tiny_spec):
    fresh_tiny_spec["trian"] = {}
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("trian: unknown section; did you mean 'train'? accepted sections: model")


def test_bare_name_means_default_params(fresh_tiny_spec):
    spec = specformer.load_spec(fresh_tiny_spec)
    assert spec.model.block.norm.as_dict() == {"kind": "rmsnorm"}


def test_kind_must_be_present(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["ffn"] = {"hidden": 3}
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.block.ffn:") and "'kind'" in msg


def test_layer_overrides_merge_same_kind_and_replace_other_kind(fresh_tiny_spec):
    fresh_tiny_spec["model"]["n_layers"] = 4
    fresh_tiny_spec["model"]["layers"] = [
        {"select": "0::2", "mixer": {"window": 8}},
        {"select": -1, "ffn": {"kind": "mlp", "activation": "relu"}},
    ]
    blocks = specformer.load_spec(fresh_tiny_spec).model.layer_blocks()
    assert [b["mixer"].get("window") for b in blocks] == [8, None, 8, None]
    assert all(b["mixer"]["n_kv_heads"] == 2 for b in blocks)  # merged, not replaced
    assert [b["ffn"]["kind"] for b in blocks] == ["swiglu", "swiglu", "swiglu", "mlp"]
    assert "hidden" not in blocks[3]["ffn"]  # a different kind replaces the whole component


def test_override_errors_point_at_the_override(fresh_tiny_spec):
    fresh_tiny_spec["model"]["layers"] = [{"select": "all", "mixer": {"window": 0}}]
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.layers[0].mixer.window:")


def test_override_selecting_missing_layer(fresh_tiny_spec):
    fresh_tiny_spec["model"]["layers"] = [{"select": 7, "mixer": {"window": 4}}]
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.layers[0].select: layer 7 does not exist")


@pytest.mark.parametrize(
    "select, expected",
    [(0, [0]), (-1, [5]), ([1, 3, 1], [1, 3]), ("0::2", [0, 2, 4]), ("-2:", [4, 5]), ("all", list(range(6))), ("3", [3])],
)
def test_select_layers(select, expected):
    assert select_layers(select, 6) == expected


@pytest.mark.parametrize("select", ["x", "1:2:3:4", "::0", "10:", True])
def test_select_layers_rejects(select):
    with pytest.raises(ValueError):
        select_layers(select, 6)


def test_missing_file_and_bad_syntax(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        specformer.load_spec(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        specformer.load_spec(bad)
    with pytest.raises(SpecError, match="accepted: .yaml, .yml, .json, .toml"):
        specformer.load_spec(tmp_path / "spec.txt")
    scalar = tmp_path / "scalar.json"
    scalar.write_text("3")
    with pytest.raises(SpecError, match="must be a mapping"):
        specformer.load_spec(scalar)


def test_a_tied_head_may_have_a_bias(fresh_tiny_spec):
    """CTRL's: the bias is a parameter of its own beside the shared weight (tests/core/model/test_tied_head_bias.py)."""
    fresh_tiny_spec["model"]["lm_head_bias"] = True
    spec = specformer.load_spec(fresh_tiny_spec)
    assert spec.model.tie_embeddings and spec.model.lm_head_bias


def test_spec_round_trips_through_json(fresh_tiny_spec):
    spec = specformer.load_spec(fresh_tiny_spec)
    again = specformer.load_spec(json.loads(spec.to_json()))
    assert again.to_dict() == spec.to_dict()
