"""GLM-4.5, MiniMax-M2, OLMo 3 and EXAONE 4: what each reads as transformers does, and what each refuses, with one
clear line (their logits, generation and round trips run in test_parity)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import specformer
import specformer_hf
from specformer.errors import UserError
from specformer_hf.config import ConfigReader
from specformer_hf.family import get_families

from fixtures.tiny import tiny_spec

SMALL = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
             num_key_value_heads=1, max_position_embeddings=64)


def _read(model_type: str, **config: Any) -> dict[str, Any]:
    family = get_families().get(model_type)
    return family.to_spec(ConfigReader({**SMALL, **config}, defaults=family.defaults, family=family.name))


# -- reading as transformers reads ------------------------------------------------------------------


def test_glm_rotates_half_of_each_head_unless_its_config_says_otherwise():
    import transformers

    assert transformers.Glm4MoeConfig().rope_parameters["partial_rotary_factor"] == 0.5  # the default we assume
    assert _read("glm4_moe")["positional"]["fraction"] == 0.5
    assert "fraction" not in _read("glm4_moe", rope_parameters={"rope_type": "default", "rope_theta": 1e6,
                                                                "partial_rotary_factor": 1.0})["positional"]


def test_glm_qk_norm_follows_use_qk_norm_and_o_proj_has_no_bias():
    off, on = _read("glm4_moe", attention_bias=True), _read("glm4_moe", use_qk_norm=True)
    assert "qk_norm" not in off["block"]["mixer"] and off["block"]["mixer"]["qkv_bias"] is True
    assert off["block"]["mixer"]["out_bias"] is False
    assert on["block"]["mixer"]["qk_norm_scope"] == "head"


@pytest.mark.parametrize(("config", "fraction"), [
    ({"head_dim": 32, "rotary_dim": 8}, 0.25),
    # A factor in rope_parameters wins over rotary_dim, in transformers too (it only fills a missing one).
    ({"head_dim": 32, "rotary_dim": 8, "rope_parameters": {"rope_type": "default", "rope_theta": 5e6,
                                                           "partial_rotary_factor": 0.5}}, 0.5),
    ({"head_dim": 32}, None),
])
def test_minimax_reads_rotary_dim_as_transformers_does(config, fraction):
    import transformers

    expected = transformers.MiniMaxM2Config(**{**SMALL, **config}).rope_parameters.get("partial_rotary_factor")
    assert expected == fraction
    assert _read("minimax_m2", **config)["positional"].get("fraction") == fraction


def test_olmo3_legacy_rope_fields_set_the_global_layers_and_leave_the_sliding_ones_at_500k():
    import transformers

    legacy = dict(rope_theta=1000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}, sliding_window=8)
    theirs = transformers.Olmo3Config(**SMALL, **legacy).rope_parameters
    assert theirs["sliding_attention"]["rope_theta"] == 500_000.0
    model = _read("olmo3", **legacy)
    assert model["positional"] == {"kind": "rope", "theta": 500_000.0}  # 3 of 4 layers slide: theirs is the block's
    assert model["layers"][-1] == {"select": 3, "positional": {"kind": "rope", "theta": 1000.0,
                                                               "scaling": {"kind": "linear", "factor": 2.0}}}


def test_exaone4_without_a_window_puts_the_rope_on_every_layer():
    model = _read("exaone4", sliding_window=None, layer_types=["full_attention"] * 4)
    assert model["block"]["mixer"]["window"] is None and "layers" not in model
    windowed = _read("exaone4", sliding_window=8)  # pattern 4: layers 0-2 slide with rope, layer 3 is global, no positions
    assert windowed["block"]["mixer"]["window"] == 8
    assert {"select": 3, "positional": "none"} in windowed["layers"]


# -- refusals on import -------------------------------------------------------------------------------


@pytest.mark.parametrize(("model_type", "config", "needle"), [
    ("minimax_m2", {"use_qk_norm": False}, "'use_qk_norm' = False is not supported"),
    ("minimax_m2", {"qk_norm_type": "per_head"}, "'qk_norm_type' = 'per_head' is not supported"),
    ("exaone4", {"sliding_window_pattern": "LLLG"}, "sliding_window_pattern 'LLLG' without layer_types"),
    ("exaone4", {"sliding_window": None, "layer_types": ["sliding_attention"] + ["full_attention"] * 3},
     "names sliding_attention layers but sliding_window is null"),
    ("olmo3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1000.0}}, "has no per-layer-type entries"),
    ("glm4_moe", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5625}},
     "rotates 9 of 16 channels"),
])
def test_configs_transformers_would_run_differently_are_refused(model_type, config, needle):
    with pytest.raises(UserError, match=needle):
        _read(model_type, **config)


# -- refusals on export -------------------------------------------------------------------------------


def _moe_spec(*, attention: dict[str, Any] | None = None, **ffn: Any) -> dict[str, Any]:
    return tiny_spec(vocab_size=64, positional={"kind": "rope", "fraction": 0.5},
                     block={"mixer": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1, **(attention or {})},
                            "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, **ffn}})


@pytest.mark.parametrize(("family", "spec", "needle"), [
    ("glm4_moe", _moe_spec(attention={"qkv_bias": True, "out_bias": True}, router={"kind": "sigmoid_topk"}),
     r"out_bias.*no bias on o_proj"),
    ("minimax_m2", _moe_spec(router={"kind": "sigmoid_topk", "scaling_factor": 2.0}),
     r"model\.block\.ffn\.router.*scaling_factor 1"),
    ("minimax_m2", _moe_spec(), r"model\.block\.ffn\.router.*sigmoid_topk"),
])
def test_export_refuses_what_the_family_cannot_hold(tmp_path, family, spec, needle):
    model = specformer.build(spec, seed=0)
    with pytest.raises(UserError, match=needle):
        specformer_hf.to_hf(model, tmp_path / "out", family=family)


def test_exaone4_export_refuses_a_global_layer_with_rope(tmp_path):
    spec = tiny_spec(vocab_size=64, block={"layout": "postnorm_inside",
                                           "mixer": {"kind": "attention", "n_heads": 2, "window": 8,
                                                         "qk_norm": "rmsnorm", "qk_norm_scope": "head"}},
                     layers=[{"select": 1, "mixer": {"window": None}}])
    with pytest.raises(UserError, match=r"model\.layers\[1\]\.positional.*global layers use none"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="exaone4")


def test_a_whole_head_glm_writes_its_factor_since_transformers_defaults_to_half(tmp_path):
    spec = _moe_spec(router={"kind": "sigmoid_topk"})
    spec["model"]["positional"] = {"kind": "rope"}
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="glm4_moe")
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["partial_rotary_factor"] == 1.0
