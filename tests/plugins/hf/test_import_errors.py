"""Unsupported or malformed Hugging Face directories fail with one clear message, never a different model."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import specformer_hf
from specformer.errors import UserError
from specformer_hf.config import UnreadConfigWarning


def _copy(saved, tmp_path: Path) -> Path:
    out = tmp_path / "model"
    shutil.copytree(saved.directory, out)
    return out


def _edit_config(directory: Path, **changes) -> None:
    config = json.loads((directory / "config.json").read_text())
    for key, value in changes.items():
        if value is _DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    (directory / "config.json").write_text(json.dumps(config))


def _edit_tensors(directory: Path, edit) -> None:
    tensors = load_file(directory / "model.safetensors")
    edit(tensors)
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})


_DELETE = object()


def _fails(directory: Path, *needles: str) -> str:
    with pytest.raises(UserError) as info:
        specformer_hf.import_hf(directory)
    message = str(info.value)
    for needle in needles:
        assert needle in message, message
    return message


def test_unknown_model_type_names_the_supported_ones(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, model_type="lama")
    _fails(d, "unknown Hugging Face model_type 'lama'", "did you mean 'llama'", "gpt2", "mixtral", "olmo2")


def test_missing_model_type(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, model_type=_DELETE)
    _fails(d, "no 'model_type'")


def test_missing_tensor_is_named(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_tensors(d, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    _fails(d, "missing tensors: model.layers.1.self_attn.k_proj.weight")


def test_shape_mismatch_with_the_config_is_named(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, intermediate_size=80)
    _fails(d, "shape does not match config.json", "model.layers.0.mlp.gate_proj.weight")


def test_tensor_the_config_does_not_describe_is_refused(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, attention_bias=False)  # the file still has the q/k/v/o biases
    _fails(d, "does not use", "model.layers.0.self_attn.q_proj.bias")


@pytest.mark.filterwarnings("ignore::specformer_hf.config.UnreadConfigWarning")
def test_wrong_family_lists_a_few_names_not_hundreds(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, model_type="gpt_neox")
    message = _fails(d, "missing tensors: gpt_neox.embed_in.weight", "and 20 more", "does not use")
    assert len(message) < 1500


def test_tied_config_with_an_equal_head_tensor_is_accepted(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, tie_word_embeddings=True)
    _edit_tensors(d, lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    model = specformer_hf.from_hf(d)
    assert model.lm_head is None
    assert torch.equal(model.embedding.weight, llama_dir.model.embedding.weight)


def test_tied_config_with_a_different_head_is_refused(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, tie_word_embeddings=True)
    _fails(d, "ties the LM head", "lm_head.weight differs")


@pytest.mark.parametrize(
    "changes, needles",
    [
        ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0}},
         ["rope_type 'proportional'", "supported: default, linear, dynamic, yarn, llama3, longrope"]),
        ({"hidden_act": "xielu"}, ["'hidden_act' = 'xielu'", "silu"]),
        ({"layer_types": ["full_attention", "chunked_attention"], "model_type": "qwen2"},
         ["layer_types ['chunked_attention'] are not supported"]),
        ({"model_type": "gemma", "use_bidirectional_attention": True}, ["'use_bidirectional_attention' = True", "not a causal LM"]),
        ({"model_type": "phi3", "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
         ["rope_type 'linear'", "supported: default, longrope"]),
        ({"num_hidden_layers": "two"}, ["'num_hidden_layers' must be an integer"]),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
         ["partial_rotary_factor 0.5 is not supported", "rotates whole heads"]),
        ({"model_type": "deepseek_v2", "num_experts_per_tok": 2, "topk_method": "noaux_tc"},
         ["'topk_method' = 'noaux_tc' is not supported", "'greedy', 'group_limited_greedy'"]),
        ({"model_type": "deepseek_v2", "num_experts_per_tok": 2, "mlp_bias": False, "moe_layer_freq": 2},
         ["'moe_layer_freq' = 2 is not supported", "every layer from first_k_dense_replace on"]),
    ],
    ids=["rope-type", "activation", "layer-type", "bidirectional", "phi3-rope", "not-a-number", "partial-rotary",
         "deepseek_v2-topk_method", "deepseek_v2-moe_layer_freq"],
)
def test_config_values_that_change_the_maths_unsupported(llama_dir, tmp_path, changes, needles):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, **changes)
    _fails(d, *needles)


@pytest.mark.filterwarnings("ignore::specformer_hf.config.UnreadConfigWarning")
def test_odd_rotary_channel_count_is_refused(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, model_type="gpt_neox", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.2})
    _fails(d, "rotates 3 of 16 channels", "cannot be split into rotation pairs")


def test_unknown_config_field_is_reported_not_silently_dropped(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, attention_chunk_size=16)
    with pytest.warns(UnreadConfigWarning, match="attention_chunk_size"):
        specformer_hf.import_hf(d)


def test_known_harmless_fields_do_not_warn(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, initializer_range=0.5, use_cache=False, pretraining_tp=1, attention_dropout=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnreadConfigWarning)
        specformer_hf.import_hf(d)


def test_unused_rope_parameter_is_reported(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    _edit_config(d, rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "beta_fast": 3})
    with pytest.warns(UnreadConfigWarning, match="beta_fast"):
        specformer_hf.import_hf(d)


def test_pickled_weights_are_refused(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    (d / "model.safetensors").unlink()
    (d / "pytorch_model.bin").write_bytes(b"not loaded")
    _fails(d, "pickled", "never loads", "safe_serialization")


def test_missing_directory_and_config(tmp_path):
    _fails(tmp_path / "nowhere", "not a directory")
    _fails(tmp_path, "no config.json")
    (tmp_path / "config.json").write_text("{not json")
    _fails(tmp_path, "not valid JSON")


def test_no_weights(llama_dir, tmp_path):
    d = _copy(llama_dir, tmp_path)
    (d / "model.safetensors").unlink()
    _fails(d, "no model.safetensors")


def test_sharded_checkpoint_is_read_and_missing_shard_is_named(llama_dir, tmp_path):
    shards = tmp_path / "sharded"
    llama_dir.hf.save_pretrained(shards, max_shard_size="40KB")
    index = json.loads((shards / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    model = specformer_hf.from_hf(shards)
    for name, tensor in llama_dir.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    victim = sorted(set(index["weight_map"].values()))[-1]
    (shards / victim).unlink()
    _fails(shards, f"in shard {victim!r}, which is missing")


def test_from_hf_casts_when_asked(llama_dir):
    model = specformer_hf.from_hf(llama_dir.directory, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
