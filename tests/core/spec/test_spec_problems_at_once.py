"""Every independent mistake in a spec is reported in one run, in file order, each once, where it is written.

A model-level problem must not hide the problems inside components, nor a bad ``select``
everything else; a check the problems make meaningless says so once.
"""

from __future__ import annotations

import pytest

import specformer
from specformer.cli.main import main
from specformer.errors import SpecError
from specformer.registry.discovery import get_registry

# Six independent mistakes, one in each part of the file, written in this order.
SIX_MISTAKES = """\
model:
  vocab_size: 259
  d_model: 128
  colour: blue
  n_layers: 4
  context_length: 128
  positional: rope
  block:
    norm: rmsnorm
    mixer: {kind: attention, n_heads: 4, qkv_biass: true}
    ffn: {kind: swiglu, hidden: -3}
  layers:
    - {select: "1::0x", mixer: {window: 16}}
    - {select: 2, mixer: {windw: 16}}
train:
  steps: 10
  batch_sise: 4
"""

SIX_PATHS = [
    "model.colour",
    "model.block.mixer.qkv_biass",
    "model.block.ffn.hidden",
    "model.layers[0].select",
    "model.layers[1].mixer.windw",
    "train.batch_sise",
]


def spec_problems(text: str, tmp_path) -> SpecError:
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        specformer.load_spec(path)
    return info.value


def test_six_independent_mistakes_are_reported_in_one_run_in_file_order(tmp_path):
    error = spec_problems(SIX_MISTAKES, tmp_path)
    assert [p.path for p in error.problems] == SIX_PATHS
    # The size checks need valid components: said once, after the problems, not silently skipped.
    assert str(error).count("checked once these are fixed") == 1
    assert "the sizes between components" in str(error).splitlines()[-1]


def test_the_cli_reports_all_six_and_exits_2(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(SIX_MISTAKES)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    places = [err.index(f"  {p}: ") for p in SIX_PATHS]
    assert places == sorted(places) and "6 problems in the spec" in err and "Traceback" not in err


def test_without_the_model_level_mistake_a_bad_select_hides_nothing(tmp_path):
    error = spec_problems(SIX_MISTAKES.replace("  colour: blue\n", ""), tmp_path)
    assert [p.path for p in error.problems] == SIX_PATHS[1:]


def test_an_override_with_a_bad_select_still_has_its_params_checked(tmp_path):
    text = SIX_MISTAKES.replace("  colour: blue\n", "").replace("qkv_biass", "qkv_bias").replace("hidden: -3", "hidden: 3")
    text = text.replace("{select: \"1::0x\", mixer: {window: 16}}", "{select: 9, mixer: {window: -1}}")
    text = text.replace("  batch_sise: 4\n", "")
    error = spec_problems(text, tmp_path)
    assert [p.path for p in error.problems] == [
        "model.layers[0].select", "model.layers[0].mixer.window", "model.layers[1].mixer.windw"]


def test_a_missing_size_does_not_hide_a_component_problem(tmp_path):
    error = spec_problems(SIX_MISTAKES.replace("  d_model: 128\n", "").replace("  colour: blue\n", ""), tmp_path)
    # A field that is not written has no place in the file: it comes after its section's written fields.
    assert [p.path for p in error.problems] == [*SIX_PATHS[1:5], "model.d_model", SIX_PATHS[5]]


def test_a_bad_n_layers_says_the_selections_were_not_checked(tmp_path):
    error = spec_problems(SIX_MISTAKES.replace("n_layers: 4", "n_layers: four"), tmp_path)
    paths = [p.path for p in error.problems]
    assert "model.n_layers" in paths and "model.layers[0].select" not in paths
    assert "model.layers[1].mixer.windw" in paths
    assert "the layer selections (they need a valid n_layers)" in str(error)


def test_a_bad_value_on_the_block_is_reported_once_where_it_is_written(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"]["n_kv_heads"] = -2
    fresh_tiny_spec["model"]["layers"] = [{"select": 0, "mixer": {"window": 16}}]
    with pytest.raises(SpecError) as info:
        specformer.load_spec(fresh_tiny_spec)
    assert [p.path for p in info.value.problems] == ["model.block.mixer.n_kv_heads"]


def test_a_check_across_the_block_component_is_reported_once_at_the_block(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"].update(n_heads=4, n_kv_heads=3)
    fresh_tiny_spec["model"]["layers"] = [{"select": 0, "mixer": {"window": 16}}]
    with pytest.raises(SpecError) as info:
        specformer.load_spec(fresh_tiny_spec)
    assert [p.path for p in info.value.problems] == ["model.block.mixer"]


def test_a_bad_value_on_every_overridden_layer_is_reported_at_the_block(fresh_tiny_spec):
    """With ``select: all`` no layer keeps the block as written; its bad value is still the block's."""
    fresh_tiny_spec["model"]["block"]["mixer"]["n_kv_heads"] = -2
    fresh_tiny_spec["model"]["layers"] = [{"select": "all", "mixer": {"window": 16}}]
    with pytest.raises(SpecError) as info:
        specformer.load_spec(fresh_tiny_spec)
    assert [p.path for p in info.value.problems] == ["model.block.mixer.n_kv_heads"]


def test_a_problem_the_override_makes_is_reported_at_the_override(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"].update(n_heads=4, n_kv_heads=2)
    fresh_tiny_spec["model"]["layers"] = [{"select": 0, "mixer": {"n_kv_heads": 3}}]
    with pytest.raises(SpecError) as info:
        specformer.load_spec(fresh_tiny_spec)
    assert [p.path for p in info.value.problems] == ["model.layers[0].mixer"]


@pytest.mark.parametrize("select, layers", [("3", [3]), (" -1 ", [3]), ("1:3", [1, 2])])
def test_a_quoted_index_or_slice_selects_those_layers(fresh_tiny_spec, select, layers):
    fresh_tiny_spec["model"]["n_layers"] = 4
    fresh_tiny_spec["model"]["layers"] = [{"select": select, "mixer": {"window": 16}}]
    spec = specformer.load_spec(fresh_tiny_spec)
    assert spec.model.layers[0].layer_indices(spec.model.n_layers) == layers


def test_a_quoted_index_out_of_range_says_which_layers_exist(fresh_tiny_spec):
    fresh_tiny_spec["model"]["layers"] = [{"select": "5", "mixer": {"window": 16}}]
    with pytest.raises(SpecError) as info:
        specformer.load_spec(fresh_tiny_spec)
    [problem] = info.value.problems
    n = fresh_tiny_spec["model"]["n_layers"]
    assert problem.message == f"layer 5 does not exist (the model has {n} layers: 0..{n - 1})"


def test_a_train_typo_lists_every_accepted_field_whole(fresh_tiny_spec):
    fresh_tiny_spec["train"] = {"batch_sise": 4}
    with pytest.raises(SpecError) as info:
        specformer.load_spec(fresh_tiny_spec)
    [problem] = info.value.problems
    line = str(problem)
    fields = list(get_registry().sections["train"][0].model_fields)
    assert "…" not in line and line.endswith("accepted: " + ", ".join(fields))
    assert "did you mean 'batch_size'?" in line


def test_a_huge_misspelt_key_is_still_cut_in_the_message(fresh_tiny_spec):
    fresh_tiny_spec["model"]["q" * 100_000] = 1
    with pytest.raises(SpecError) as info:
        specformer.load_spec(fresh_tiny_spec)
    line = str(info.value.problems[0])
    assert "accepted: vocab_size" in line and len(line) < 1000
