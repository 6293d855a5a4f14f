"""DiffLlama's export refusals and its read config (parity with transformers: the diffllama cases of test_parity)."""

from __future__ import annotations

import json

import pytest
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("diffllama")
    BY_NAME["diffllama"].build().save_pretrained(folder)
    return specformer_hf.import_hf(folder)


def test_the_spec_pairs_the_heads_with_a_weightless_norm_of_the_block_eps(imported):
    mixer = imported.spec["model"]["block"]["mixer"]
    assert mixer["differential"] is True
    assert mixer["differential_norm"] == {"kind": "rmsnorm", "eps": 1e-4, "weight": False}


@pytest.mark.parametrize(("change", "message"), [
    ({"differential": False}, r"differential.*always differential"),
    ({"differential_norm": {"kind": "rmsnorm", "eps": 1e-4}}, r"differential_norm.*without a weight"),
    ({"differential_norm": {"kind": "rmsnorm", "eps": 1e-6, "weight": False}}, r"differential_norm.*rms_norm_eps"),
])
def test_export_refuses_what_diffllama_cannot_hold(imported, tmp_path, change, message):
    spec = json.loads(json.dumps(imported.spec))
    spec["model"]["block"]["mixer"].update(change)
    with pytest.raises(UserError, match=message):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path, family="diffllama")


def test_export_writes_the_lambda_spread(imported, tmp_path):
    out = specformer_hf.to_hf(imported.model, tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "diffllama" and config["lambda_std_dev"] == 0.1
