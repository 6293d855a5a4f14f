"""Falcon-H1 and Granite 4.0-H beyond parity (test_parity): what they read, what they refuse in one clear line, and
the config values that must come back exactly."""

from __future__ import annotations

import json
import math
import random

import pytest
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError
from specformer_hf.config import ConfigReader
from specformer_hf.family import get_families
from specformer_hf.parts.base import exact_preimage
from specformer_hf.parts.mamba2 import json_float
from fixtures.tiny import tiny_spec


def _folder(tmp_path, case_name: str, **changes):
    """A transformers-saved folder of ``case_name`` whose config.json then gets ``changes``."""
    BY_NAME[case_name].build().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    return tmp_path


def _read(model_type: str, **config):
    family = get_families().get(model_type)
    return family.to_spec(ConfigReader(config, defaults=family.defaults, family=family.name))


def test_a_multiplier_read_from_a_config_is_written_back_so_that_it_reads_back_exactly():
    rng = random.Random(0)
    c = 128 ** -0.5
    for _ in range(2000):
        value = rng.uniform(1e-2, 20.0)  # a config's logits_scaling or key_multiplier
        scale = 1.0 / value  # Granite's logit_scale
        assert 1.0 / exact_preimage(scale, lambda v: 1.0 / v, 1.0 / scale) == scale
        scale = value * c  # Falcon-H1's attention scale
        assert exact_preimage(scale, lambda v: v * c, scale / c) * c == scale
    # A scale written by hand that no key multiplier reaches exactly: the nearest guess, within an ulp or so.
    unreachable = next(s for s in (rng.uniform(0.5, 1.0) for _ in range(1000))
                       if all(v * c != s for v in (s / c, math.nextafter(s / c, 0), math.nextafter(s / c, 9))))
    assert math.isclose(exact_preimage(unreachable, lambda v: v * c, unreachable / c) * c, unreachable, rel_tol=1e-15)


def test_time_step_limit_reads_numbers_and_transformers_tagged_infinity():
    assert json_float({"__float__": "Infinity"}, "Falcon-H1") == math.inf
    assert json_float(0.5, "Falcon-H1") == 0.5
    with pytest.raises(UserError, match=r"time_step_limit holds \{'x': 1\}, not a number"):
        json_float({"x": 1}, "Falcon-H1")
    spec = _read("granitemoehybrid", num_hidden_layers=1, layer_types=["mamba"], hidden_size=64, mamba_n_heads=4,
                 time_step_limit=[0.001, {"__float__": "Infinity"}])
    assert (spec["block"]["mixer"]["dt_min"], spec["block"]["mixer"]["dt_max"]) == (0.001, None)


def test_granite_reads_layer_types_old_and_new_and_puts_the_common_mixer_in_the_block():
    spec = _read("granitemoehybrid", num_hidden_layers=5, hidden_size=64, num_attention_heads=4, mamba_n_heads=4,
                 layer_types=["mamba", "full_attention", "linear_attention", "attention", "mamba"])
    assert spec["block"]["mixer"]["kind"] == "mamba2"
    assert spec["layers"] == [{"select": "1::2", "mixer": {
        "kind": "attention", "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "qkv_bias": False, "out_bias": False,
        "scale": 1.0}}]
    assert spec["positional"] == {"kind": "none"}


@pytest.mark.parametrize(("changes", "message"), [
    ({"layer_types": ["mamba", "conv"]}, r"layer_types \['conv'\] are not supported; supported: linear_attention"),
    ({"layer_types": ["mamba"]}, "layer_types must name the type of each of the 2 layers"),
    ({"position_embedding_type": "alibi"}, "position_embedding_type"),
    ({"logits_scaling": 0.0}, "logits_scaling divides the logits and must be positive"),
])
def test_granite_refuses_what_it_cannot_read_in_one_line(changes, message):
    with pytest.raises(UserError, match=message) as caught:
        _read("granitemoehybrid", num_hidden_layers=2, hidden_size=64, mamba_n_heads=4, **changes)
    assert "\n" not in str(caught.value)


def test_falcon_refuses_different_biases_on_the_two_mamba_projections(tmp_path):
    folder = _folder(tmp_path, "falcon_h1", mamba_proj_bias=True, projectors_bias=False)
    with pytest.raises(UserError, match="mamba_proj_bias \\(True\\) and projectors_bias \\(False\\) differ") as caught:
        specformer_hf.import_hf(folder)
    assert "\n" not in str(caught.value)


def test_falcon_reads_null_multipliers_as_ones_and_refuses_a_short_list():
    spec = _read("falcon_h1", num_hidden_layers=1, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                 mamba_d_ssm=64, mamba_n_heads=4, mlp_multipliers=None, ssm_multipliers=None)
    parallel = spec["block"]["mixer"]
    assert parallel["mixers"][0]["projection_multipliers"] == [1.0] * 5
    assert (spec["block"]["ffn"]["gate_multiplier"], spec["block"]["ffn"]["output_multiplier"]) == (1.0, 1.0)
    assert "scale" not in parallel["mixers"][1]  # key_multiplier 1: the attention's own 1/sqrt(head_dim)
    with pytest.raises(UserError, match=r"ssm_multipliers must be a list of 5 numbers, got \[1.0, 2.0\]"):
        _read("falcon_h1", num_hidden_layers=1, hidden_size=64, mamba_d_ssm=64, mamba_n_heads=4,
              ssm_multipliers=[1.0, 2.0])


def _falcon_like(mixers: list) -> dict:
    return tiny_spec(vocab_size=64, n_layers=1,
                     block={"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-5},
                            "mixer": {"kind": "parallel", "mixers": mixers}})


MAMBA = {"kind": "mamba2", "n_heads": 4, "head_dim": 8, "state_size": 8, "norm_eps": 1e-5, "gated_norm": False}


def test_falcon_export_needs_mamba2_then_attention(tmp_path):
    model = specformer.build(_falcon_like([{"kind": "attention", "n_heads": 4}, MAMBA]), seed=0)
    with pytest.raises(UserError, match=r"\['attention', 'mamba2'\]: Hugging Face Falcon-H1 runs \['mamba2', "):
        specformer_hf.to_hf(model, tmp_path / "out", family="falcon_h1")


def test_falcon_export_writes_a_key_multiplier_that_reads_back_as_the_scale(tmp_path):
    scale = 0.3  # not 1 / sqrt(8) times a round number
    model = specformer.build(_falcon_like([MAMBA, {"kind": "attention", "n_heads": 4, "scale": scale}]), seed=0)
    out = specformer_hf.to_hf(model, tmp_path / "out", family="falcon_h1")
    config = json.loads((out / "config.json").read_text())
    assert config["key_multiplier"] * 8 ** -0.5 == scale
    assert specformer_hf.import_hf(out).spec["model"]["block"]["mixer"]["mixers"][1]["scale"] == scale


def test_granite_export_refuses_a_mamba_norm_eps_of_its_own(tmp_path):
    spec = tiny_spec(vocab_size=64, positional="none",
                     block={"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-5},
                            "mixer": {**MAMBA, "gated_norm": True, "norm_eps": 1e-6}})
    with pytest.raises(UserError, match="Mamba norm uses rms_norm_eps, the block norms' eps"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="granitemoehybrid")
