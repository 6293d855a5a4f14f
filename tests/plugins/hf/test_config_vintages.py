"""Older config.json layouts (transformers 4 and the original checkpoints) import to the same model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import specformer_hf


def _rewrite_config(src, dst, edit):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    edit(config)
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _matches_transformers(directory, model, length=24):
    """transformers reads the old layout too: its logits must equal ours."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = torch.randint(0, model.vocab_size, (2, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (reference(ids).logits - model(ids)).abs().max().item() <= 1e-4


def _same_model(a, b):
    assert a.spec.to_dict() == b.spec.to_dict()
    for name, tensor in a.state_dict().items():
        assert torch.equal(b.state_dict()[name], tensor), name


def test_legacy_rope_theta_and_rope_scaling_keys(tmp_path):
    import transformers

    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
        rope_parameters={"rope_type": "linear", "factor": 3.0, "rope_theta": 5000.0}))
    hf.save_pretrained(tmp_path / "v5")

    def legacy(config):
        config.pop("rope_parameters")
        config["rope_theta"] = 5000.0
        config["rope_scaling"] = {"type": "linear", "factor": 3.0}

    v4 = _rewrite_config(tmp_path / "v5", tmp_path / "v4", legacy)
    _same_model(specformer_hf.from_hf(tmp_path / "v5"), specformer_hf.from_hf(v4))
    _matches_transformers(v4, specformer_hf.from_hf(v4))
    assert specformer_hf.from_hf(v4).spec.model.positional.as_dict() == {
        "kind": "rope", "theta": 5000.0, "scaling": {"kind": "linear", "factor": 3.0}}


def test_gpt_neox_rotary_pct_and_rotary_emb_base(saved_neox, tmp_path):
    def legacy(config):
        params = config.pop("rope_parameters")
        config["rotary_pct"] = params["partial_rotary_factor"]
        config["rotary_emb_base"] = params["rope_theta"]

    v4 = _rewrite_config(saved_neox.directory, tmp_path / "v4", legacy)
    _same_model(saved_neox.model, specformer_hf.from_hf(v4))
    _matches_transformers(v4, saved_neox.model)


def test_gemma_gelu_means_the_tanh_approximation(saved_gemma, tmp_path):
    def legacy(config):
        config["hidden_act"] = "gelu"

    old = _rewrite_config(saved_gemma.directory, tmp_path / "old", legacy)
    model = specformer_hf.from_hf(old)
    assert model.spec.model.block.ffn.as_dict()["activation"] == "gelu_tanh"
    _same_model(saved_gemma.model, model)
    _matches_transformers(old, model)


def test_phi3_su_rope_is_longrope(saved_phi3, tmp_path):
    def legacy(config):
        # transformers takes the original context from the top-level field over the rope parameters' own.
        config["original_max_position_embeddings"] = 16
        config["rope_scaling"] = {"type": "su", "short_factor": [1.0 + 0.1 * i for i in range(8)],
                                  "long_factor": [2.0 + 0.2 * i for i in range(8)], "original_max_position_embeddings": 4096}

    su = _rewrite_config(saved_phi3.directory, tmp_path / "su", legacy)
    model = specformer_hf.from_hf(su)
    scaling = model.spec.model.positional.as_dict()["scaling"]
    assert scaling["kind"] == "longrope" and scaling["original_context_length"] == 16
    _matches_transformers(su, model)  # 24 tokens: past 16, so the long factors are in use


def test_gpt2_base_model_file_without_prefix_and_with_mask_buffers(saved_gpt2, tmp_path):
    d = tmp_path / "gpt2"
    shutil.copytree(saved_gpt2.directory, d)
    tensors = load_file(d / "model.safetensors")
    renamed = {name.removeprefix("transformer."): t for name, t in tensors.items()}
    for i in range(2):  # what transformers 2-4 checkpoints carried: the causal mask as a buffer
        renamed[f"h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
        renamed[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    save_file(renamed, str(d / "model.safetensors"), metadata={"format": "pt"})
    _same_model(saved_gpt2.model, specformer_hf.from_hf(d))
    _matches_transformers(saved_gpt2.directory, specformer_hf.from_hf(d))


@pytest.mark.parametrize("first_sliding", [0, 1, 2, 3])
def test_qwen2_max_window_layers_without_layer_types(saved_qwen2, tmp_path, first_sliding):
    # Configs saved before transformers wrote layer_types say which layers slide with max_window_layers
    # alone: layer i uses the window when i >= max_window_layers (Qwen2Config.__post_init__).
    def legacy(config):
        del config["layer_types"]
        config["max_window_layers"] = first_sliding

    old = _rewrite_config(saved_qwen2.directory, tmp_path / "old", legacy)
    model = specformer_hf.from_hf(old)
    window = saved_qwen2.case.kwargs["sliding_window"]
    n_layers = saved_qwen2.case.kwargs["num_hidden_layers"]
    expected = [None if i < first_sliding else window for i in range(n_layers)]
    assert _windows(model) == expected
    # transformers reads the same old file; 24 tokens is past the window, so a layer given the wrong
    # attention changes the logits.
    assert 24 > window
    _matches_transformers(old, model)


def _windows(model):
    from specformer_hf.specview import SpecView

    return SpecView.of(model.spec).per_layer("mixer", "window")
