"""Hugging Face folders written by someone else: forged indices, links, dtypes and configs fail clearly.

Every folder here is forged with safetensors and JSON directly. Each case ends in one
clear UserError (never a traceback, never a file outside the folder read, never a model
of the config's size allocated before the stored shapes are checked).
"""

from __future__ import annotations

import json
import os

import hf_forge
import pytest
import torch
from safetensors.torch import save_file

import specformer
import specformer_hf
from specformer.cli.main import main
from specformer.errors import UserError


def _fails(directory, *needles: str) -> str:
    with pytest.raises(UserError) as info:
        specformer_hf.import_hf(directory)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


def _sharded(tmp_path, weight_map=None):
    """A valid two-shard Llama folder; ``weight_map`` (if given) replaces the correct index."""
    d = tmp_path / "m"
    d.mkdir()
    config = hf_forge.llama_config()
    (d / "config.json").write_text(json.dumps(config))
    tensors = hf_forge.llama_tensors(config)
    names = sorted(tensors)
    files = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2:]}
    correct = {n: f for f, ns in files.items() for n in ns}
    return hf_forge.shard(d, tensors, correct if weight_map is None else weight_map, files=files), tensors, correct


def test_a_forged_valid_folder_imports_exactly(tmp_path):
    # The baseline the cases below break: the forge writes what the Llama mapping reads.
    d, tensors, _ = _sharded(tmp_path)
    model = specformer_hf.import_hf(d).model
    assert torch.equal(model.embedding.weight, tensors["model.embed_tokens.weight"])
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])


@pytest.mark.parametrize("weight_map", [["model.norm.weight"], "a.safetensors", None, 3],
                         ids=["list", "string", "null", "number"])
def test_weight_map_that_is_not_a_mapping(tmp_path, weight_map):
    d, _, _ = _sharded(tmp_path)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _fails(d, "model.safetensors.index.json", "'weight_map' is missing or not an object",
           "expected an object {'weight_map': {tensor name: shard file name}}")


@pytest.mark.parametrize("text", ["[1, 2]", "{not json", "[" * 100_000 + "]" * 100_000],
                         ids=["list", "garbage", "deeply-nested"])
def test_index_that_is_not_an_object(tmp_path, text):
    d, _, _ = _sharded(tmp_path)
    (d / "model.safetensors.index.json").write_text(text)
    _fails(d, "model.safetensors.index.json", "expected an object")


def test_weight_map_entry_that_is_not_a_file_name(tmp_path):
    d, _, correct = _sharded(tmp_path)
    name = next(iter(correct))
    _sharded_index = {**correct, name: {"file": "a.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": _sharded_index}))
    _fails(d, f"tensor {name!r} has shard", "expected a file name")


def test_index_naming_a_tensor_its_shard_lacks(tmp_path):
    d, _, correct = _sharded(tmp_path)
    name = next(n for n, f in correct.items() if f == "a.safetensors")
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {**correct, name: "b.safetensors"}}))
    _fails(d, "b.safetensors", f"places tensor {name!r} in this file, but it is not there")


@pytest.mark.parametrize("where", ["parent", "absolute"])
def test_shard_outside_the_folder_is_never_read(tmp_path, where):
    d, tensors, correct = _sharded(tmp_path)
    # A perfectly good shard outside the folder: following the entry would import it.
    outside = tmp_path / "elsewhere.safetensors"
    save_file({n: tensors[n] for n, f in correct.items() if f == "a.safetensors"}, str(outside))
    entry = "../elsewhere.safetensors" if where == "parent" else str(outside)
    forged = {n: (entry if f == "a.safetensors" else f) for n, f in correct.items()}
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": forged}))
    _fails(d, repr(entry), "outside the model folder")


def test_shard_that_is_a_link_out_of_the_folder_is_refused(tmp_path):
    d, tensors, _ = _sharded(tmp_path)
    outside = tmp_path / "secret.safetensors"
    os.replace(d / "a.safetensors", outside)
    os.symlink(outside, d / "a.safetensors")
    _fails(d, "shard 'a.safetensors' leads outside the model folder")


def test_single_weights_file_and_config_linking_out_are_refused(tmp_path):
    d = hf_forge.llama_folder(tmp_path / "m")
    os.replace(d / "model.safetensors", tmp_path / "w.safetensors")
    os.symlink(tmp_path / "w.safetensors", d / "model.safetensors")
    _fails(d, "model.safetensors leads outside the model folder")

    e = hf_forge.llama_folder(tmp_path / "e")
    os.replace(e / "config.json", tmp_path / "config.json")
    os.symlink(tmp_path / "config.json", e / "config.json")
    _fails(e, "config.json leads outside the model folder")


def test_links_inside_the_folder_and_the_hugging_face_cache_layout_are_followed(tmp_path):
    # ~/.cache/huggingface/hub/models--org--name/snapshots/REV/* link to ../../blobs/HASH.
    repo = tmp_path / "models--org--tiny"
    source = hf_forge.llama_folder(tmp_path / "source")
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for i, name in enumerate(("config.json", "model.safetensors")):
        os.replace(source / name, repo / "blobs" / f"hash{i}")
        os.symlink(f"../../blobs/hash{i}", snapshot / name)
    cached = specformer_hf.import_hf(snapshot).model

    inside = hf_forge.llama_folder(tmp_path / "inside")
    (inside / "store").mkdir()
    os.replace(inside / "model.safetensors", inside / "store" / "w.safetensors")
    os.symlink("store/w.safetensors", inside / "model.safetensors")
    linked = specformer_hf.import_hf(inside).model
    for name, tensor in cached.state_dict().items():
        assert torch.equal(linked.state_dict()[name], tensor), name


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool, torch.uint8])
def test_integer_and_bool_weights_are_refused_by_name(tmp_path, dtype):
    config = hf_forge.llama_config()
    tensors = hf_forge.llama_tensors(config)
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.ones(24, 16, dtype=dtype)
    d = hf_forge.write_folder(tmp_path / "m", config, tensors)
    message = _fails(d, "must be floating point", "model.layers.0.mlp.up_proj.weight")
    assert {torch.int64: "I64", torch.int8: "I8", torch.bool: "BOOL", torch.uint8: "U8"}[dtype] in message


def test_integer_tensor_the_family_ignores_is_not_an_error(saved_gpt2, tmp_path):
    # GPT-2 files from old transformers carry a bool/uint8 causal-mask buffer ("attn.bias"): ignored, not a weight.
    import shutil

    from safetensors.torch import load_file

    d = tmp_path / "m"
    shutil.copytree(saved_gpt2.directory, d)
    tensors = load_file(d / "model.safetensors")
    tensors["transformer.h.0.attn.bias"] = torch.ones(1, 1, 64, 64, dtype=torch.uint8)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    model = specformer_hf.import_hf(d).model
    for name, tensor in saved_gpt2.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name


def _only_meta_builds(monkeypatch):
    """Record every device specformer.build is asked for (the import must not build for real when it refuses)."""
    devices = []
    real = specformer.build

    def spy(*args, **kwargs):
        devices.append(str(kwargs.get("device")))
        return real(*args, **kwargs)

    monkeypatch.setattr(specformer, "build", spy)
    return devices


@pytest.mark.parametrize("layers", [1, 4], ids=["few-tensors", "checked-on-meta"])
def test_config_with_only_model_type_is_refused_before_building_a_7b_model(tmp_path, monkeypatch, layers):
    # 1 layer: fewer tensors than the default 32 layers; 4 layers (39 tensors): the 7B skeleton is built on the
    # meta device and its shapes compared with the headers.
    d = hf_forge.write_folder(tmp_path / "m", {"model_type": "llama"}, hf_forge.llama_tensors({"num_hidden_layers": layers}))
    devices = _only_meta_builds(monkeypatch)
    message = _fails(d, "config.json leaves out", "hidden_size", "num_hidden_layers", "hidden_size=4096",
                     "set them to the model's sizes")
    assert devices == ([] if layers == 1 else ["meta"]), devices


def test_stored_shapes_are_compared_before_allocating(tmp_path, monkeypatch):
    # 2 layers of width 2**20 would need ~100 TB: refused from the headers, with the mismatches named.
    config = hf_forge.llama_config(hidden_size=2**20, intermediate_size=2**21, num_hidden_layers=1)
    d = hf_forge.write_folder(tmp_path / "m", config, hf_forge.llama_tensors())
    devices = _only_meta_builds(monkeypatch)
    _fails(d, "shape does not match config.json", "model.layers.0.mlp.gate_proj.weight", "(24, 16)")
    assert all(device == "meta" for device in devices), devices


def test_layer_count_beyond_the_stored_tensors_is_refused_before_building(tmp_path, monkeypatch):
    d = hf_forge.write_folder(tmp_path / "m", hf_forge.llama_config(num_hidden_layers=10**8), hf_forge.llama_tensors())
    devices = _only_meta_builds(monkeypatch)
    _fails(d, "describes 100000000 layers (num_hidden_layers), but the weights hold only 12 tensors")
    assert devices == []


def test_untrusted_folder_errors_exit_2_with_one_line(tmp_path, capsys):
    d, _, correct = _sharded(tmp_path)
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {n: "/etc/passwd" for n in correct}}))
    assert main(["hf", "import", str(d), str(tmp_path / "o.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "outside the model folder" in err and "Traceback" not in err
    assert not (tmp_path / "o.safetensors").exists()


LAYER_KEYS = {"gpt2": "n_layer"}
ALL_FAMILIES = ["gpt2", "gpt_neox", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo2"]


@pytest.mark.parametrize("model_type", ALL_FAMILIES)
def test_a_forged_layer_count_costs_nothing_in_any_family(tmp_path, model_type):
    # Families that build a per-layer list while reading the config (Qwen2's windows, Gemma 2's layer types,
    # GPT-2's scales) must not be handed 10**18 layers: the count is checked against the tensors first.
    key = LAYER_KEYS.get(model_type, "num_hidden_layers")
    config = {"model_type": model_type, key: 10**18, "use_sliding_window": True, "sliding_window": 4}
    d = hf_forge.write_folder(tmp_path / "m", config, hf_forge.llama_tensors())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fails(d, f"describes {10**18} layers ({key}), but the weights hold only 12 tensors",
               "config.json leaves out")


@pytest.mark.parametrize("changes, needle", [
    ({"num_attention_heads": 0}, "'num_attention_heads' must be a positive integer, got 0"),
    ({"hidden_size": -16}, "'hidden_size' must be a positive integer, got -16"),
    ({"num_hidden_layers": True}, "'num_hidden_layers' must be an integer, got True"),
    ({"hidden_act": ["silu"]}, "'hidden_act' = ['silu'] is an activation specformer does not implement"),
])
def test_config_values_of_the_wrong_type_or_sign(tmp_path, changes, needle):
    d = hf_forge.write_folder(tmp_path / "m", hf_forge.llama_config(**changes), hf_forge.llama_tensors())
    _fails(d, needle)


def test_a_family_tripping_over_a_value_still_gives_one_clear_error(tmp_path):
    # A third-party family that does arithmetic on a field without checking its type.
    import dataclasses

    from specformer_hf.families import llama as llama_family
    from specformer_hf.family import Families

    def careless(cfg):
        return {**llama_family.FAMILY.to_spec(cfg), "d_model": cfg.get("hidden_size") * 2 // cfg.get("width_divisor")}

    families = Families()
    families.add(dataclasses.replace(llama_family.FAMILY, name="Careless", model_type="careless", to_spec=careless,
                                     plugin="test"))
    d = hf_forge.write_folder(tmp_path / "m", hf_forge.llama_config(model_type="careless", width_divisor=0),
                              hf_forge.llama_tensors())
    with pytest.raises(UserError, match=r"Careless: config.json holds a value this family cannot read "
                                        r"\(ZeroDivisionError: integer division or modulo by zero\)"):
        specformer_hf.import_hf(d, families=families)


def test_tensors_a_rule_cannot_combine_are_a_shape_error(tmp_path):
    # Found by the fuzzing: a 0-d q_proj made the q/k/v concatenation raise inside torch.
    config = hf_forge.llama_config()
    tensors = hf_forge.llama_tensors(config)
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(())
    d = hf_forge.write_folder(tmp_path / "m", config, tensors)
    _fails(d, "shape does not match config.json", "model.layers.0.self_attn.q_proj.weight ()")
