"""Gemma 4 beyond the shared parity cases: a published checkpoint's layout (the k/v tensors its KV-sharing layers
keep, global_head_dim instead of per_layer_config), the multimodal checkpoints' language models (Gemma 4's and Gemma 4
unified's), and refusals."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch
from hf_cases import BY_NAME
from multimodal import check_language_model_import
from safetensors.torch import load_file, save_file

import specformer
import specformer_hf
from fixtures.tiny import tiny_spec
from specformer.errors import UserError

TOLERANCE = 1e-4


def _quiet_import(path):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")
        return specformer_hf.import_hf(path)


def test_a_published_layout_imports_as_the_saved_one(tmp_path):
    """Hub files say global_head_dim and num_global_key_value_heads (transformers turns them into per_layer_config
    when it loads) and keep k/v projections and norms for the KV-sharing layers, which transformers drops."""
    hf = BY_NAME["gemma4"].build()
    hf.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    del config["per_layer_config"]
    config.update(global_head_dim=32, num_global_key_value_heads=1)
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    weights = load_file(tmp_path / "hf" / "model.safetensors")
    for layer in (3, 4):  # the two sharing layers
        weights[f"model.layers.{layer}.self_attn.k_proj.weight"] = torch.randn(16, 64)
        weights[f"model.layers.{layer}.self_attn.k_norm.weight"] = torch.randn(16)
    save_file(weights, tmp_path / "hf" / "model.safetensors", metadata={"format": "pt"})
    imported = _quiet_import(tmp_path / "hf")
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (imported.model(ids) - hf(ids).logits).abs().max().item() <= TOLERANCE
    assert [a.kv_from for a in imported.model.attention_modules()] == [None, None, None, 2, 1]


@pytest.mark.slow
def test_a_multimodal_gemma4_checkpoint_imports_as_its_language_model(tmp_path):
    """Gemma4ForConditionalGeneration: text_config, model.language_model.*, a vision tower, the head tied on top."""
    import transformers

    text = {**BY_NAME["gemma4"].kwargs, "pad_token_id": 0}  # the multimodal forward masks media tokens with it
    vision = {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
              "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4, "position_embedding_size": 16}
    config = transformers.Gemma4Config(text_config=text, vision_config=vision, audio_config=None)
    torch.manual_seed(0)
    hf = transformers.Gemma4ForConditionalGeneration(config).eval()
    check_language_model_import(hf, tmp_path, model_type="gemma4", text_class="Gemma4ForCausalLM")


def _gemma4_like(**layers_change):
    """A spec the Gemma 4 family writes: four layers, the last global, layer 3 reading layer 1's keys and values."""
    return tiny_spec(
        vocab_size=64, n_layers=4, embedding_multiplier="sqrt_d_model",
        block={"layout": {"kind": "sandwich", "layer_scale": True}, "norm": {"kind": "rmsnorm", "eps": 1e-6},
               "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "window": 4,
                         "qk_norm": {"kind": "rmsnorm", "eps": 1e-6}, "scale": 1.0,
                         "v_norm": {"kind": "rmsnorm", "eps": 1e-6, "weight": False}},
               "ffn": {"kind": "geglu", "hidden": 48, "activation": "gelu_tanh"}},
        layers=[{"select": "1::2", "mixer": {"window": None}},
                {"select": 3, "mixer": {"kv_from": 1, "v_norm": None}}, *layers_change.get("extra", [])])


@pytest.mark.parametrize(("extra", "message"), [
    ([{"select": 2, "mixer": {"kv_from": 0, "v_norm": None}},  # layer 2 reads, layer 3 after it keeps its own
      {"select": 3, "mixer": {"kv_from": None, "v_norm": {"kind": "rmsnorm", "eps": 1e-6, "weight": False}}}],
     "model.layers[*].mixer.kv_from: Hugging Face Gemma 4 shares keys and values in its last layers only"),
    ([{"select": 3, "mixer": {"kv_from": 1, "window": 4}}, {"select": 2, "mixer": {"kv_from": 0, "v_norm": None}}],
     "model.layers[3].mixer.window: Hugging Face Gemma 4's last layer is global (window null)"),
])
def test_specs_gemma4_cannot_hold_are_refused(tmp_path, extra, message):
    model = specformer.build(_gemma4_like(extra=extra), seed=0)
    with pytest.raises(specformer.errors.UserError, match=re.escape(message)):
        specformer_hf.to_hf(model, tmp_path / "export", family="gemma4_text")


def test_a_layer_reading_another_than_transformers_would_is_refused(tmp_path):
    """Layers 1, 2 and 3 global: layer 3 reading layer 1's keys is a valid spec, but transformers' layer 3 reads
    layer 2's (the last earlier global layer that keeps its own)."""
    spec = _gemma4_like()
    spec["model"]["layers"][0]["select"] = "1:"
    model = specformer.build(spec, seed=0)
    with pytest.raises(specformer.errors.UserError, match=re.escape(
            "model.layers[3].mixer.kv_from: 1: Hugging Face Gemma 4's layer 3 reads layer 2's (the last earlier "
            "full_attention layer of its own)")):
        specformer_hf.to_hf(model, tmp_path / "export", family="gemma4_text")


def test_the_defaults_outside_the_config_fields_are_transformers():
    """The rope parameters and the global heads transformers' __post_init__ fills in when a config leaves them out."""
    import transformers

    from specformer_hf.families.gemma4 import DEFAULT_ROPE, GLOBAL_HEAD_DIM

    config = transformers.Gemma4TextConfig(num_hidden_layers=6)
    assert config.rope_parameters == DEFAULT_ROPE
    assert config.per_layer_config[5].head_dim == GLOBAL_HEAD_DIM and config.per_layer_config[5].num_key_value_heads == 4


@pytest.mark.slow
def test_a_multimodal_gemma4_unified_checkpoint_imports_as_its_language_model(tmp_path):
    """Gemma4UnifiedForConditionalGeneration: text_config, model.language_model.*, image and audio embedders (no
    encoders), the head tied on top."""
    import transformers

    text = {**BY_NAME["gemma4_unified_text"].kwargs, "pad_token_id": 0}  # the multimodal forward masks media tokens
    vision = {"patch_size": 4, "pooling_kernel_size": 2, "mm_embed_dim": 16, "mm_posemb_size": 8,
              "output_proj_dims": 16}
    config = transformers.Gemma4UnifiedConfig(text_config=text, vision_config=vision, audio_config=None)
    torch.manual_seed(0)
    hf = transformers.Gemma4UnifiedForConditionalGeneration(config).eval()
    assert any(name.startswith("model.embed_vision.") for name, _ in hf.named_parameters())
    check_language_model_import(hf, tmp_path, model_type="gemma4_unified", text_class="Gemma4UnifiedForCausalLM")


@pytest.mark.parametrize("field", ["hidden_size_per_layer_input", "enable_moe_block"])
def test_gemma4_unified_text_refuses_per_layer_inputs_and_experts(tmp_path, field):
    hf = BY_NAME["gemma4_unified_text"].build()
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), field: 8 if field != "enable_moe_block" else True}))
    with pytest.raises(UserError, match=f"'{field}'.*no per-layer inputs and no mixture of experts"):
        _quiet_import(tmp_path / "hf")


def test_gemma4_unified_text_export_refuses_per_layer_inputs(tmp_path):
    BY_NAME["gemma4"].build().save_pretrained(tmp_path / "hf")  # Gemma 4 text, with per-layer inputs
    imported = _quiet_import(tmp_path / "hf")
    with pytest.raises(UserError, match="Gemma 4 unified.*no per-layer inputs"):
        specformer_hf.to_hf(imported.model, tmp_path / "export", family="gemma4_unified_text")
