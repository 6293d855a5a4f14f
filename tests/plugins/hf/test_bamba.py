"""Bamba's half rope and attention layers (parity with transformers: the bamba cases of test_parity)."""

from __future__ import annotations

import json

import pytest
from hf_cases import BY_NAME

import specformer_hf
from specformer.errors import UserError


def _folder(tmp_path, case: str = "bamba", **changes):
    BY_NAME[case].build().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    return tmp_path


def test_rope_parameters_without_a_factor_rotate_half_of_each_head(tmp_path):
    """BambaConfig fills in partial_rotary_factor 0.5 where the file names none (its published configs name none)."""
    imported = specformer_hf.import_hf(_folder(tmp_path, rope_parameters={"rope_type": "default", "rope_theta": 500.0}))
    assert imported.spec["model"]["positional"] == {"kind": "rope", "theta": 500.0, "fraction": 0.5}


def test_attention_layer_indices_outside_the_model_are_refused(tmp_path):
    with pytest.raises(UserError, match=r"attn_layer_indices must list layer indices below 3, got \[1, 3\]"):
        specformer_hf.import_hf(_folder(tmp_path, attn_layer_indices=[1, 3]))
