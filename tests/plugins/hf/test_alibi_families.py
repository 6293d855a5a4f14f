"""The ALiBi families (issue 44): MPT's refusals and export, and specformer's slopes against transformers'.

Parity with transformers (logits, greedy tokens, export, round trip) is tests/plugins/hf/test_parity.py's.
"""

from __future__ import annotations

import json

import pytest
import torch
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError
from specformer_layers.positional.alibi import alibi_slopes
from fixtures.tiny import tiny_spec


def test_alibi_slopes_are_transformers_bloom_and_mpt_slopes():
    """The same slopes as BLOOM's _get_alibi_slopes and MPT's build_mpt_alibi_tensor (alibi_bias_max 8), for power-of-two
    head counts and the others (the power below, then every other slope of the power above).

    specformer rounds each slope once from float64. MPT's float32 1 / 2^x is within a unit in the last place of
    that; BLOOM raises a float32-rounded base to the k-th power, so its k-th slope carries up to k times the base's
    rounding (19 units in the last place at 256 heads): the same slopes, rounded less carefully.
    """
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    eps = torch.finfo(torch.float32).eps
    for n_heads in range(1, 257):
        ours = torch.tensor(alibi_slopes(n_heads), dtype=torch.float32)
        bloom = _get_alibi_slopes(n_heads, torch.device("cpu"))
        mpt = -build_mpt_alibi_tensor(n_heads, 2)[:, 0, 0]  # (H,): the bias of the key one position back, negated
        torch.testing.assert_close(ours, mpt, rtol=eps, atol=0, msg=lambda m: f"{n_heads} heads, MPT: {m}")
        torch.testing.assert_close(ours, bloom, rtol=n_heads * eps, atol=0, msg=lambda m: f"{n_heads} heads, BLOOM: {m}")


def _mpt_folder(tmp_path, *, attn_config=None, **changes):
    """The tiny MPT case saved by transformers, its config.json then given ``changes`` (``attn_config`` merged)."""
    BY_NAME["mpt"].build().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config.update(changes)
    config["attn_config"] = {**config["attn_config"], **(attn_config or {})}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("changes, needle", [
    ({"attn_config": {"alibi_bias_max": 16}}, r"'alibi_bias_max' = 16 is not supported: specformer's alibi has the "
                                              r"slopes of a maximum bias of 8"),
    ({"attn_config": {"qk_ln": True}}, r"'qk_ln' = True is not supported: transformers' MPT does not build the q/k "
                                       r"LayerNorms"),
    ({"attn_config": {"attn_type": "multiquery_attention"}}, r"'attn_type' = 'multiquery_attention' is not supported"),
    ({"expansion_ratio": 2}, r"'expansion_ratio' = 2 is not supported: transformers' MPT always builds its MLP four "
                             r"times as wide"),
    ({"no_bias": False}, r"'no_bias' = False is not supported"),
    ({"logit_scale": 0.5}, r"'logit_scale' = 0.5 is not supported: transformers' MPT does not scale its logits"),
])
def test_mpt_import_refuses_what_it_cannot_reproduce_in_one_line(tmp_path, changes, needle):
    with pytest.raises(UserError, match=needle) as refused:
        specformer_hf.import_hf(_mpt_folder(tmp_path, **changes))
    assert "\n" not in str(refused.value)


def test_mpt_import_reads_the_nested_attention_settings(tmp_path):
    imported = specformer_hf.import_hf(_mpt_folder(tmp_path))
    model = imported.spec["model"]
    assert model["positional"] == {"kind": "alibi"}
    assert model["block"]["mixer"]["scale"] == 0.3
    assert model["block"]["norm"] == {"kind": "layernorm", "eps": 1e-4, "bias": False}


ALIBI_SPEC = tiny_spec(vocab_size=64, d_model=48, n_layers=1, tie_embeddings=False, positional="alibi",
                       block={"layout": "prenorm", "norm": {"kind": "layernorm", "bias": False},
                              "mixer": {"kind": "attention", "n_heads": 3, "qkv_bias": False, "out_bias": False},
                              "ffn": {"kind": "mlp", "hidden": 192, "activation": "gelu", "bias": False}})["model"]


def test_an_alibi_spec_exports_as_mpt(tmp_path):
    out = specformer_hf.to_hf(specformer.build({"model": ALIBI_SPEC}, seed=0), tmp_path / "out")
    written = json.loads((out / "config.json").read_text())
    assert (written["model_type"], written["n_heads"], written["attn_config"]["alibi_bias_max"]) == ("mpt", 3, 8)


@pytest.mark.parametrize("change, needle", [
    ({"ffn": {"kind": "mlp", "hidden": 96, "activation": "gelu", "bias": False}}, r"MPT's MLP is always 4 x d_model"),
    ({"norm": "layernorm"}, r"MPT's LayerNorms have a weight and no bias"),
])
def test_mpt_export_refuses_what_it_cannot_hold(tmp_path, change, needle):
    spec = {"model": {**ALIBI_SPEC, "block": {**ALIBI_SPEC["block"], **change}}}
    with pytest.raises(UserError, match=needle):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="mpt")
