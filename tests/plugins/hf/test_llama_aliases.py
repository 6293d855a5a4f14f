"""Llama under other model_types (EXAONE 3, InternLM3, IQuest-Coder): the spellings their published config.json files
use, and what transformers refuses for them, refused here too (their parity runs in test_parity)."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError
from specformer_hf.config import UnreadConfigWarning
from fixtures.tiny import tiny_spec


def _folder(tmp_path, case_name: str, *, drop: tuple[str, ...] = (), **changes):
    """A transformers-saved folder of ``case_name`` whose config.json then loses ``drop`` and gets ``changes``."""
    hf = BY_NAME[case_name].build()
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in drop}
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    return hf, tmp_path


def test_exaone_reads_the_published_field_names(tmp_path):
    """EXAONE 3's published config.json says num_layers, layer_norm_epsilon and activation_function (ExaoneConfig's
    attribute_map): read as the Llama fields, every one understood, the same logits as transformers."""
    hf, folder = _folder(tmp_path, "exaone", drop=("num_hidden_layers", "rms_norm_eps", "hidden_act"),
                         num_layers=2, layer_norm_epsilon=1e-4, activation_function="silu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = specformer_hf.import_hf(folder)
    assert [str(w.message) for w in caught if issubclass(w.category, UnreadConfigWarning)] == []
    assert imported.spec["model"]["n_layers"] == 2 and imported.spec["model"]["block"]["norm"]["eps"] == 1e-4
    ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (imported.model(ids) - hf(ids).logits).abs().max().item() <= 1e-4


def test_exaone_refuses_two_spellings_that_disagree(tmp_path):
    _, folder = _folder(tmp_path, "exaone", num_layers=3)
    with pytest.raises(UserError, match=r"sets both 'num_layers' \(3\) and 'num_hidden_layers' \(2\)"):
        specformer_hf.import_hf(folder)


def test_exaone_writes_the_tensor_names_transformers_saves(tmp_path):
    _, folder = _folder(tmp_path, "exaone")
    imported = specformer_hf.import_hf(folder)
    out = specformer_hf.to_hf(imported.model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "exaone"
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "transformer.h.1.attn.attention.out_proj.bias" in names and "transformer.wte.weight" in names
    assert not any(name.startswith("model.") for name in names)


def test_internlm3_reads_qkv_bias_and_bias(tmp_path):
    """InternLM3-8B's config.json says qkv_bias and bias (InternLM3Config's attribute_map)."""
    hf, folder = _folder(tmp_path, "internlm3", drop=("attention_bias", "mlp_bias"), qkv_bias=True, bias=True)
    imported = specformer_hf.import_hf(folder)
    block = imported.spec["model"]["block"]
    assert (block["mixer"]["qkv_bias"], block["mixer"]["out_bias"], block["ffn"]["bias"]) == (True, True, True)


@pytest.mark.parametrize("changes", [dict(attention_bias=True, mlp_bias=False), dict(attention_bias=False, mlp_bias=True)])
def test_internlm3_refuses_biases_that_differ_as_transformers_does(tmp_path, changes):
    _, folder = _folder(tmp_path, "internlm3", **changes)
    with pytest.raises(UserError) as caught:
        specformer_hf.import_hf(folder)
    assert "attention_bias (qkv_bias)" in str(caught.value) and "must be equal" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_internlm3_export_refuses_biases_that_differ(tmp_path):
    spec = tiny_spec(vocab_size=128, d_model=64, n_layers=1,
                     block={"mixer": {"kind": "attention", "n_heads": 4, "qkv_bias": True},
                            "ffn": {"kind": "swiglu", "hidden": 96}})
    with pytest.raises(UserError, match="InternLM3"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="internlm3")


@pytest.mark.parametrize("changes, needle", [
    (dict(clip_qkv=8.0), "'clip_qkv' = 8.0 is not supported"),
    (dict(use_sliding_window=True), "'use_sliding_window' = True is not supported"),
])
def test_iquestcoder_refuses_what_transformers_refuses(tmp_path, changes, needle):
    _, folder = _folder(tmp_path, "iquestcoder", **changes)
    with pytest.raises(UserError, match=needle):
        specformer_hf.import_hf(folder)
