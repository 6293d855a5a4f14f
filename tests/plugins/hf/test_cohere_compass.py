"""Cohere Compass: the published multimodal checkpoint read for its language model, and the rope entries
transformers' model needs (the parity cases in hf_cases.py cover the text model itself)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hf_cases import BY_NAME
from multimodal import check_language_model_import

import specformer_hf
from specformer.errors import UserError


def test_a_multimodal_cohere_compass_checkpoint_imports_as_its_language_model(tmp_path):
    """CohereCompassForConditionalGeneration (Qwen3-VL's layout): text_config, model.language_model.*, the vision
    encoder (model.visual.*), the head tied at the top level."""
    import transformers

    text = {**BY_NAME["cohere_compass_text"].kwargs, "pad_token_id": 0, "tie_word_embeddings": True}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 64,
              "patch_size": 4, "spatial_merge_size": 1, "temporal_patch_size": 1, "num_position_embeddings": 16,
              "deepstack_visual_indexes": []}
    config = transformers.CohereCompassConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.CohereCompassForConditionalGeneration(config).eval()
    assert any(name.startswith("model.visual.") for name, _ in hf.named_parameters())
    check_language_model_import(hf, tmp_path, model_type="cohere_compass", text_class="CohereCompassForCausalLM")


def test_a_layer_type_without_a_rope_entry_is_refused(tmp_path):
    """transformers' model reads rope_parameters[layer_type] for every layer type: a missing one cannot run."""
    case = BY_NAME["cohere_compass_text"]
    case.save(case.build(), tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    del config["rope_parameters"]["full_attention"]
    path.write_text(json.dumps(config))
    with warnings.catch_warnings(), pytest.raises(UserError, match="rope_parameters has no entry for full_attention"):
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")
        specformer_hf.import_hf(tmp_path)
