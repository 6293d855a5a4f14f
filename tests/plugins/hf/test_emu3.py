"""Emu3's two other layouts (the parity cases cover the nested one Emu3ForCausalLM loads): the flat config
Emu3ForCausalLM saves, and the published multimodal checkpoint (text_model.model.*, vqmodel.*)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hf_cases import BY_NAME

import specformer_hf
from specformer.errors import UserError

TOLERANCE = 1e-4


def _import(directory):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")
        return specformer_hf.import_hf(directory)


def _shaken(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _ids():
    return torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))


def _reloads_with_the_same_logits(imported, directory, reference):
    from transformers import AutoModelForCausalLM

    out = specformer_hf.to_hf(imported.model, directory)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "emu3" and config["text_config"]["model_type"] == "emu3_text_model"
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == "Emu3ForCausalLM"
    with torch.no_grad():
        assert (reloaded(_ids()).logits - reference).abs().max().item() <= TOLERANCE


def test_the_flat_config_emu3forcausallm_saves_imports_and_exports_nested(tmp_path):
    """model_type emu3_text_model, which AutoModelForCausalLM cannot load: read, and written as emu3."""
    hf = BY_NAME["emu3"].build()
    hf.save_pretrained(tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "emu3_text_model"
    imported = _import(tmp_path / "hf")
    assert imported.family.model_type == "emu3_text_model"
    with torch.no_grad():
        reference = hf(_ids()).logits
        assert (imported.model(_ids()) - reference).abs().max().item() <= TOLERANCE
    _reloads_with_the_same_logits(imported, tmp_path / "export", reference)


def test_a_published_emu3_checkpoint_imports_as_its_language_model(tmp_path):
    """Emu3ForConditionalGeneration saves text_model.model.*, text_model.lm_head.weight and vqmodel.*."""
    import transformers

    text = {**BY_NAME["emu3"].kwargs, "num_hidden_layers": 2}
    vq = {"codebook_size": 16, "embed_dim": 4, "latent_channels": 4, "base_channels": 32, "channel_multiplier": [1, 1],
          "num_res_blocks": 1, "attn_resolutions": [], "hidden_size": 32}
    config = transformers.Emu3Config(text_config=text, vq_config=vq, vocabulary_map={"<image>": 3})
    torch.manual_seed(0)
    hf = _shaken(transformers.Emu3ForConditionalGeneration(config))
    hf.save_pretrained(tmp_path / "hf")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "text_model.lm_head.weight" in names and any(n.startswith("vqmodel.") for n in names)
    imported = _import(tmp_path / "hf")
    assert imported.family.model_type == "emu3"
    with torch.no_grad():
        reference = hf(input_ids=_ids()).logits
        assert (imported.model(_ids()) - reference).abs().max().item() <= TOLERANCE
    _reloads_with_the_same_logits(imported, tmp_path / "export", reference)


def test_disagreeing_ties_are_refused(tmp_path):
    BY_NAME["emu3"].save(BY_NAME["emu3"].build(), tmp_path)
    path = tmp_path / "config.json"
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "tie_word_embeddings": True}))
    with pytest.raises(UserError, match="tie_word_embeddings is True at the top level but False in text_config"):
        _import(tmp_path)
