"""DBRX's refusals and its nested config (parity with transformers: the dbrx cases of test_parity)."""

from __future__ import annotations

import json

import pytest
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError
from specformer_hf.config import UnreadConfigWarning


def _folder(tmp_path, *, attn=None, ffn=None):
    """The dbrx case saved by transformers, then its nested configs updated with ``attn`` and ``ffn``."""
    BY_NAME["dbrx"].build().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["attn_config"].update(attn or {})
    config["ffn_config"].update(ffn or {})
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("p", [2.0, 0.5])
def test_expert_weights_normalised_by_another_p_norm_are_refused(tmp_path, p):
    with pytest.raises(UserError, match=rf"'ffn_config.moe_normalize_expert_weights' = {p} is not supported: .*only "
                                        r"for p = 1 .* or null"):
        specformer_hf.import_hf(_folder(tmp_path, ffn={"moe_normalize_expert_weights": p}))


def test_activation_with_arguments_is_refused(tmp_path):
    with pytest.raises(UserError, match=r"ffn_act_fn = .* only a 'name'"):
        specformer_hf.import_hf(_folder(tmp_path, ffn={"ffn_act_fn": {"name": "silu", "approximate": "tanh"}}))


def test_a_rope_theta_in_attn_config_that_transformers_5_ignores_is_reported(tmp_path):
    with pytest.warns(UnreadConfigWarning, match=r"attn_config\.rope_theta"):
        imported = specformer_hf.import_hf(_folder(tmp_path, attn={"rope_theta": 500000.0}))
    assert imported.spec["model"]["positional"]["theta"] == 5000.0  # rope_parameters', as transformers 5 runs it


def test_export_writes_the_rope_base_in_both_places_and_refuses_an_unclipped_attention(tmp_path):
    imported = specformer_hf.import_hf(_folder(tmp_path / "in"))
    out = specformer_hf.to_hf(imported.model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["attn_config"]["rope_theta"] == config["rope_parameters"]["rope_theta"] == 5000.0
    assert config["ffn_config"]["moe_normalize_expert_weights"] == 1.0
    spec = json.loads(json.dumps(imported.spec))
    del spec["model"]["block"]["mixer"]["clip_qkv"]
    with pytest.raises(UserError, match=r"clip_qkv.*DBRX always clamps q, k and v"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "unclipped", family="dbrx")
