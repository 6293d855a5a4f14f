"""The exact shape of spec error messages: one path format, "did you mean" everywhere, the wrong kind named.

Paths are written ``generate.sampler[1].k`` (dots for fields, ``[i]`` for list
indices) wherever a problem is reported: the model section, a plugin's section, and
inside a sub-component (an attention's ``qk_norm``, a sampler of the list).
"""

from __future__ import annotations

import pytest

import specformer
from specformer.cli.main import main
from specformer.errors import MAX_PROBLEMS_SHOWN, Problem, SpecError, problems_line
from specformer.registry.params import resolve_component
from specformer.spec import ModelSpec


def problems(spec: dict) -> list[str]:
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    return [str(p) for p in info.value.problems]


def registered(kind: str) -> str:
    return ", ".join(specformer.get_registry().names(kind))


def test_misspelt_model_field_suggests_the_field_and_lists_the_accepted_ones(fresh_tiny_spec):
    fresh_tiny_spec["model"]["d_modle"] = fresh_tiny_spec["model"].pop("d_model")
    found = problems(fresh_tiny_spec)
    assert f"model.d_modle: unknown field; did you mean 'd_model'? accepted: {', '.join(ModelSpec.model_fields)}" in found


def test_misspelt_section_suggests_the_section(fresh_tiny_spec):
    fresh_tiny_spec["trian"] = {"steps": 3}
    sections = ", ".join(["model", *sorted(specformer.get_registry().sections)])
    assert problems(fresh_tiny_spec) == [f"trian: unknown section; did you mean 'train'? accepted sections: {sections}"]


def test_misspelt_field_of_a_plugin_section_suggests_the_field(fresh_tiny_spec):
    fresh_tiny_spec["train"] = {"lrr": 1e-3}
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("train.lrr: unknown field; did you mean 'lr'? accepted: steps, ")


def test_a_field_with_nothing_close_lists_the_accepted_ones_without_a_guess(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["ffn"]["zzzz"] = 1
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.block.ffn.zzzz: unknown field; accepted: ")
    assert "did you mean" not in msg


def test_misspelt_component_name_suggests_the_closest(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["norm"] = "rmsnrom"
    assert problems(fresh_tiny_spec) == [
        f"model.block.norm.kind: unknown norm 'rmsnrom'; did you mean 'rmsnorm'? registered norm components: {registered('norm')}"
    ]


def test_a_component_of_another_kind_says_which_kind_it_is(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["norm"] = "swiglu"
    assert problems(fresh_tiny_spec) == [
        f"model.block.norm.kind: 'swiglu' is an ffn, not a norm; registered norm components: {registered('norm')}"
    ]


def test_article_follows_how_the_kind_is_spoken(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["ffn"] = "attention"
    fresh_tiny_spec["model"]["positional"] = "rmsnorm"
    assert sorted(problems(fresh_tiny_spec)) == [
        f"model.block.ffn.kind: 'attention' is a mixer, not an ffn; registered ffn components: {registered('ffn')}",
        f"model.positional.kind: 'rmsnorm' is a norm, not a positional; registered positional components: {registered('positional')}",
    ]


def test_problems_inside_a_sampler_list_use_the_one_path_format(fresh_tiny_spec):
    fresh_tiny_spec["generate"] = {"sampler": [{"kind": "top_k", "k": 3}, {"kind": "top_k", "kk": 2}, "topp",
                                               "rmsnorm"]}
    samplers = registered("sampler")
    assert problems(fresh_tiny_spec) == [
        "generate.sampler[1].kk: unknown field; did you mean 'k'? accepted: k, min_tokens_to_keep",
        f"generate.sampler[2].kind: unknown sampler 'topp'; did you mean 'top_p'? registered sampler components: {samplers}",
        f"generate.sampler[3].kind: 'rmsnorm' is a norm, not a sampler; registered sampler components: {samplers}",
    ]


def test_problems_inside_a_nested_component_of_the_model_use_the_one_path_format(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"]["qk_norm"] = {"kind": "rmsnorm", "epss": 1e-5}
    assert problems(fresh_tiny_spec) == [
        "model.block.mixer.qk_norm.epss: unknown field; did you mean 'eps'? accepted: eps, offset, weight"
    ]


def test_a_bad_value_inside_a_nested_component_names_its_full_path(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"]["qk_norm"] = {"kind": "rmsnorm", "eps": -1}
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.block.mixer.qk_norm.eps: ") and "greater than 0" in msg and "(got -1)" in msg


def test_layer_override_problems_are_at_their_list_index(fresh_tiny_spec):
    fresh_tiny_spec["model"]["layers"] = [{"select": 0}, {"select": 7, "ffn": {"hidden": 8}}]
    [msg] = problems(fresh_tiny_spec)
    assert msg.startswith("model.layers[1].select: layer 7 does not exist")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "model:\n  a: [1,\n  b: 2\n",
         "not valid YAML at line 4, column 1: expected ',' or ']', but got '<stream end>' "
         "(while parsing a flow sequence that starts at line 2, column 6)"),
        ("indent.yaml", "model:\n  a: 1\n   b: 2\n", "not valid YAML at line 3, column 5: mapping values are not allowed here"),
        ("bad.json", '{"model": {"a": 1,}}', "not valid JSON at line 1, column 19: Expecting property name enclosed in double quotes"),
        ("bad.toml", "[model]\na = \n", "not valid TOML at line 2, column 5: Invalid value"),
    ],
)
def test_a_file_that_does_not_parse_is_named_with_line_and_column(tmp_path, capsys, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == f"{path}: 1 problem in the spec:\n  {expected}\n"
    assert "<unicode string>" not in err


def test_the_cli_prints_every_problem_in_the_one_format(tmp_path, capsys):
    path = tmp_path / "typos.yaml"
    path.write_text(
        "model:\n  vocab_size: 97\n  d_model: 32\n  n_layers: 2\n  context_length: 32\n  positional: rope\n"
        "  block:\n    norm: swiglu\n    mixer: {kind: attention, n_heads: 4}\n    ffn: {kind: swiglu, hidden: 48}\n"
        "trian: {}\n"
    )
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"{path}: 2 problems in the spec:"
    assert lines[1] == f"  model.block.norm.kind: 'swiglu' is an ffn, not a norm; registered norm components: {registered('norm')}"
    assert lines[2].startswith("  trian: unknown section; did you mean 'train'? accepted sections: model, ")
    assert lines[3].startswith("  (checked once these are fixed: the sizes between components")


def test_components_of_an_unknown_kind_suggests_the_kind(capsys):
    assert main(["components", "nrom"]) == 2
    kinds = ", ".join(sorted(specformer.get_registry().kinds))
    assert capsys.readouterr().err == f"error: unknown kind 'nrom'; did you mean 'norm'? known kinds: {kinds}\n"


def test_a_structural_problem_in_the_model_still_reports_the_sections_problems(fresh_tiny_spec):
    fresh_tiny_spec["model"]["d_modle"] = fresh_tiny_spec["model"].pop("d_model")
    fresh_tiny_spec["trian"] = {}
    fresh_tiny_spec["generate"] = {"sampler": [{"kind": "temperature", "valeu": 0.8}]}
    found = problems(fresh_tiny_spec)  # in file order: the model's keys come first
    assert found[0].startswith("model.d_modle: unknown field; did you mean 'd_model'?")
    assert found[1].startswith("trian: unknown section; did you mean 'train'?")
    assert found[2] == "generate.sampler[0].valeu: unknown field; did you mean 'value'? accepted: value"
    assert len(found) == 3


def test_the_docs_example_of_typos_prints_what_the_page_explains(capsys):
    from conftest import REPO

    assert main(["validate", str(REPO / "docs/snippets/typos.yaml")]) == 2
    lines = capsys.readouterr().err.splitlines()[1:-1]  # the last line names the checks left for later
    assert [line.split(":")[0].strip() for line in lines] == ["model.block.norm.kind", "trian", "generate.sampler[1].valeu"]
    assert "'swiglu' is an ffn, not a norm" in lines[0]


def test_a_check_across_a_components_params_does_not_quote_the_whole_mapping(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["norm"] = "rmsnrom"
    fresh_tiny_spec["model"]["block"]["mixer"]["n_kv_heads"] = 3
    assert problems(fresh_tiny_spec) == [
        f"model.block.norm.kind: unknown norm 'rmsnrom'; did you mean 'rmsnorm'? registered norm components: {registered('norm')}",
        "model.block.mixer: n_kv_heads (3) must divide n_heads (4)",
    ]


def test_a_norm_that_fails_inside_a_layout_is_reported_at_the_norms_path(fresh_tiny_spec):
    from specformer.registry.components import Registry
    from specformer.registry.discovery import get_registry
    from specformer.registry.params import Params

    registry = Registry(kinds=dict(get_registry().kinds))
    for c in get_registry():
        registry.for_plugin(c.plugin).register(c.kind, c.name, factory=c.factory, params=c.params, doc=c.doc)

    def picky(params, *, dim):
        raise ValueError(f"dim must be 12345, got {dim}")

    registry.for_plugin("picky").register("norm", "picky", factory=picky, params=Params)
    fresh_tiny_spec["model"]["block"]["norm"] = "picky"
    with pytest.raises(SpecError) as info:
        specformer.load_spec(fresh_tiny_spec, registry=registry)
    assert [str(p) for p in info.value.problems] == ["model.block.norm: dim must be 12345, got 32"]


def test_a_missing_field_is_not_reported_twice_when_a_misspelt_key_names_it(fresh_tiny_spec):
    fresh_tiny_spec["model"]["d_modle"] = fresh_tiny_spec["model"].pop("d_model")
    assert problems(fresh_tiny_spec) == [
        f"model.d_modle: unknown field; did you mean 'd_model'? accepted: {', '.join(ModelSpec.model_fields)}"
    ]


def test_a_missing_field_no_key_was_meant_for_is_still_reported(fresh_tiny_spec):
    del fresh_tiny_spec["model"]["d_model"]
    fresh_tiny_spec["model"]["zzz"] = 1
    found = problems(fresh_tiny_spec)  # a field not written has no place: after the written ones
    assert found[0].startswith("model.zzz: unknown field; accepted: ")
    assert found[1] == "model.d_model: required field is missing"


@pytest.mark.parametrize("ref", [
    {"kind": "attention", "n_heads": "four", "qk_norm": {"kind": "rmsnorm", "epss": 1e-5}, "windw": 3},
    {"kind": "atention", "n_heads": 4},
    {"n_heads": 4},
])
def test_a_component_read_outside_a_spec_is_worded_as_the_spec_words_it(fresh_tiny_spec, ref):
    """resolve_component (a checkpoint's header, a flag) gives the lines load_spec gives, under its own path."""
    fresh_tiny_spec["model"]["block"]["mixer"] = ref
    in_spec = problems(fresh_tiny_spec)
    with pytest.raises(SpecError) as info:
        resolve_component("mixer", ref, path="header.attention")
    outside = [str(p) for p in info.value.problems]
    assert outside == [line.replace("model.block.mixer", "header.attention") for line in in_spec]
    assert all("\n" not in line and "pydantic.dev" not in line for line in outside)


def test_problems_on_one_line_are_joined_and_capped():
    assert problems_line([Problem("a.b", "bad"), Problem("", "no path")]) == "a.b: bad; no path"
    many = [Problem(f"x[{i}]", "bad") for i in range(MAX_PROBLEMS_SHOWN + 3)]
    line = problems_line(many)
    assert "\n" not in line and line.endswith(f"x[{MAX_PROBLEMS_SHOWN - 1}]: bad; ... and 3 more")
