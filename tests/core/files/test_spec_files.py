"""Reading spec files people send: bounded in size, depth and YAML alias expansion; clear errors."""

from __future__ import annotations

import json
import time

import pytest
import yaml

import specformer
from specformer.files import datafile
from specformer.files.datafile import MAX_DEPTH, MAX_NODES, parse_yaml, read_data_file
from specformer.errors import InputError, SpecError

from conftest import TINY


def _bomb(levels: int = 9, width: int = 9) -> str:
    """The "billion laughs": each level lists the previous one ``width`` times (width**levels leaves)."""
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_before_anything_walks_it():
    text = _bomb()
    assert len(text) < 1500
    start = time.monotonic()
    with pytest.raises(InputError, match="aliases"):
        parse_yaml(text)
    assert time.monotonic() - start < 10  # a generous bound: walking the expanded tree takes hours


def test_alias_bomb_in_a_typed_field_of_a_spec_file(tmp_path):
    """The issue's case: the bomb sits where validation (and its message) would walk it."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb() + "model:\n  vocab_size: *a9\n")
    with pytest.raises(SpecError) as info:
        specformer.load_spec(path)
    message = str(info.value)
    assert str(path) in message and f"{MAX_NODES:,} values" in message
    assert len(message) < 500


def test_modest_aliases_are_still_fine():
    data = parse_yaml("base: &b {kind: rmsnorm, eps: 1.0e-5}\nx: *b\ny: *b\n")
    assert data["x"] == data["y"] == {"kind": "rmsnorm", "eps": 1e-5}


def test_merge_keys_count_too():
    """``<<: *a`` merges are aliases as well; a bomb built from merges is caught the same way."""
    lines = ["l0: &l0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8}"]
    for i in range(1, 10):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    lines.append("top: {<<: *l0, x: *l9}")
    with pytest.raises(InputError, match="aliases"):
        parse_yaml("\n".join(lines))


def test_recursive_alias_is_refused():
    with pytest.raises(InputError, match="recursive"):
        parse_yaml("a: &a [1, *a]\n")


@pytest.mark.parametrize("suffix", [".yaml", ".json", ".toml"])
def test_deep_nesting_is_a_clear_error_not_a_recursion_error(tmp_path, suffix):
    depth = 5000
    if suffix == ".toml":
        text = "x = " + "[" * depth + "]" * depth + "\n"
    else:
        text = "[" * depth + "]" * depth
    path = tmp_path / f"deep{suffix}"
    path.write_text(text)
    with pytest.raises(SpecError, match=f"nested more than {MAX_DEPTH} levels"):
        specformer.load_spec(path)


def test_nesting_just_inside_the_bound_parses():
    data = parse_yaml("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1))
    depth = 0
    while isinstance(data, list) and data:
        data, depth = data[0], depth + 1
    assert depth == MAX_DEPTH - 2


def test_non_utf8_spec_names_the_file_and_the_byte(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("model:\n  name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError) as info:
        specformer.load_spec(path)
    assert str(path) in str(info.value) and "not UTF-8" in str(info.value) and "0xe9" in str(info.value)


def test_utf8_bom_is_accepted(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(TINY).encode())
    assert specformer.load_spec(path).model.d_model == TINY["model"]["d_model"]


def test_directory_given_as_spec_says_so(tmp_path):
    folder = tmp_path / "model.yaml"
    folder.mkdir()
    with pytest.raises(SpecError, match="is a directory, not a spec file"):
        specformer.load_spec(folder)
    with pytest.raises(SpecError, match="is a directory"):
        specformer.load_spec(tmp_path)


def test_oversized_file_is_refused_without_reading_it_all(tmp_path, monkeypatch):
    monkeypatch.setattr(datafile, "MAX_FILE_BYTES", 1000)
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * 2000 + "\n" + yaml.safe_dump(TINY))
    with pytest.raises(SpecError, match="larger than 1000 B, the most accepted"):
        specformer.load_spec(path)


def test_many_values_without_aliases_are_bounded_too(tmp_path, monkeypatch):
    monkeypatch.setattr(datafile, "MAX_NODES", 50)
    path = tmp_path / "wide.json"
    path.write_text(json.dumps({"model": list(range(100))}))
    with pytest.raises(SpecError, match="more than 50 values"):
        specformer.load_spec(path)


def test_yaml_python_tags_are_not_executed(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("model: !!python/object/apply:os.system ['echo hacked']\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        specformer.load_spec(path)


def test_a_huge_bad_value_is_quoted_as_a_short_excerpt(tmp_path):
    spec = json.loads(json.dumps(TINY))
    spec["model"]["d_model"] = "x" * 100_000
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    (line,) = [line for line in str(info.value).splitlines() if "model.d_model" in line]
    assert "xxx" in line and len(line) < 250


def test_a_huge_bad_component_param_is_quoted_as_a_short_excerpt():
    spec = json.loads(json.dumps(TINY))
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": ["y" * 100_000] * 1000}
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    assert "model.block.mixer.n_heads" in str(info.value) and len(str(info.value)) < 500


def test_a_long_layer_selection_is_quoted_as_a_short_excerpt():
    spec = json.loads(json.dumps(TINY))
    spec["model"]["layers"] = [{"select": "z" * 50_000, "mixer": {"window": 4}}]
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    assert "model.layers[0].select" in str(info.value) and len(str(info.value)) < 500


def test_read_data_file_is_usable_for_other_files(tmp_path):
    """Plugins read their own YAML/JSON files (sampler lists) through the same bounded reader."""
    path = tmp_path / "samplers.yaml"
    path.write_text("- {kind: top_k, k: 3}\n")
    assert read_data_file(path, what="sampler file") == [{"kind": "top_k", "k": 3}]
    with pytest.raises(InputError, match="no such file"):
        read_data_file(tmp_path / "none.yaml", what="sampler file")


def test_a_spec_with_thousands_of_mistakes_gives_a_bounded_message():
    spec = json.loads(json.dumps(TINY))
    spec["model"].update({f"typo_{i}": i for i in range(5000)})
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    assert len(info.value.problems) == 5000
    message = str(info.value)
    assert "5,000 problems" in message and "and 4,950 more" in message and len(message) < 20_000


def test_a_pipe_named_like_a_spec_is_refused_not_waited_on(tmp_path):
    import os

    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        specformer.load_spec(fifo)


def test_a_path_too_long_to_open_is_a_spec_error(tmp_path):
    with pytest.raises(SpecError, match="cannot be opened"):
        specformer.load_spec(tmp_path / ("x" * 5000 + ".yaml"))
