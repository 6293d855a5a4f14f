"""Families transformers runs with another family's classes (GPT-SW3 as GPT-2, Sarvam-105B as DeepSeek-V3, Param2
and Sarvam-30B as GLM-4.5): the spellings their published config.json files use, read as transformers reads them
(their parity runs in test_parity)."""

from __future__ import annotations

import json
import warnings

import torch
from hf_cases import BY_NAME

import specformer_hf
from specformer_hf.config import UnreadConfigWarning


def _folder(tmp_path, case_name: str, *, drop: tuple[str, ...] = (), **changes):
    """A saved folder of ``case_name`` whose config.json then loses ``drop`` and gets ``changes``."""
    case = BY_NAME[case_name]
    hf = case.build()
    case.save(hf, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in drop}
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    return hf, tmp_path


def _imports_with_the_same_logits(hf, folder):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = specformer_hf.import_hf(folder)
    assert [str(w.message) for w in caught if issubclass(w.category, UnreadConfigWarning)] == []
    ids = torch.randint(0, 128, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (imported.model(ids) - hf(ids).logits).abs().max().item() <= 1e-4
    return imported


def test_sarvam_mla_reads_the_original_config_spellings(tmp_path):
    """sarvamai/sarvam-105b's config.json, written for the remote code: num_experts and num_shared_experts, a head_dim
    of kv_lora_rank + qk_rope_head_dim and a q_head_dim (derived sizes, dropped), YaRN as rope_scaling 'deepseek_yarn'.
    SarvamMLAConfig translates them; the model is the one the case saved."""
    hf, folder = _folder(
        tmp_path, "sarvam_mla", drop=("n_routed_experts", "n_shared_experts", "rope_parameters"),
        num_experts=6, num_shared_experts=2, head_dim=28, q_head_dim=20, rope_theta=10000.0,
        rope_scaling={"type": "deepseek_yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
                      "mscale_all_dim": 1.0, "beta_fast": 32.0, "beta_slow": 1.0})
    imported = _imports_with_the_same_logits(hf, folder)
    assert imported.family.model_type == "sarvam_mla"
    assert imported.spec["model"]["positional"]["scaling"]["kind"] == "yarn"
    out = specformer_hf.to_hf(imported.model, tmp_path / "out")
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "sarvam_mla" and written["n_routed_experts"] == 6
    assert written["rope_parameters"]["rope_type"] == "yarn"


def test_param2moe_reads_the_original_config_spellings(tmp_path):
    """bharatgenai's Param2 config.json says num_experts, num_shared_experts and use_qkv_bias (Param2MoeConfig's
    attribute_map), and leaves out partial_rotary_factor: whole heads rotate (Param2MoeConfig's default, where GLM-4.5's
    is half of each head)."""
    hf, folder = _folder(tmp_path, "param2moe", drop=("n_routed_experts", "n_shared_experts", "attention_bias",
                                                      "rope_parameters"),
                         num_experts=6, num_shared_experts=2, use_qkv_bias=True, rope_theta=500000.0)
    imported = _imports_with_the_same_logits(hf, folder)
    assert imported.spec["model"]["positional"].get("fraction", 1.0) == 1.0
    assert imported.spec["model"]["block"]["mixer"]["qkv_bias"] is True


def test_sarvam_moe_checkpoints_keep_the_original_tensor_names(tmp_path):
    """transformers saves Sarvam-30B (and Param2) under the remote code's names; export writes the same ones."""
    from safetensors import safe_open

    _, folder = _folder(tmp_path, "sarvam_moe")
    imported = specformer_hf.import_hf(folder)
    out = specformer_hf.to_hf(imported.model, tmp_path / "out")
    with safe_open(out / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert {"model.word_embeddings.weight", "model.layers.0.attention.query_key_value.weight",
            "model.layers.0.attention.dense.weight", "model.layers.0.attention.query_layernorm.weight",
            "model.layers.0.mlp.gate.expert_bias"} <= names
    assert not any(".self_attn." in name or "embed_tokens" in name for name in names)
