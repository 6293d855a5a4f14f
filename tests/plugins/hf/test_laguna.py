"""Laguna's refusals (parity with transformers: the laguna cases of test_parity)."""

from __future__ import annotations

import json

import pytest
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    path = tmp_path_factory.mktemp("laguna")
    BY_NAME["laguna"].build().save_pretrained(path)
    return path, json.loads((path / "config.json").read_text())


@pytest.mark.parametrize(("change", "message"), [
    ({"gating": "per-element", "attention_bias": True}, r"attention_bias with per-element gating is not supported"),
    ({"moe_apply_router_weight_on_input": True}, r"'moe_apply_router_weight_on_input' = True is not supported"),
    ({"gating": "per-channel"}, r"gating must be true or 'per-head' .* or 'per-element'"),
    ({"num_attention_heads_per_layer": [4, 6]}, r"num_attention_heads_per_layer must give a positive head count for "
                                                r"each of the 4 layers"),
])
def test_configs_transformers_cannot_run_or_specformer_cannot_express_are_refused(saved, tmp_path, change, message):
    path, config = saved
    (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
    (tmp_path / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    with pytest.raises(UserError, match=message):
        specformer_hf.import_hf(tmp_path)


def test_export_refuses_a_sigmoid_gate_and_a_biased_channel_gate(saved, tmp_path):
    spec = specformer_hf.import_hf(saved[0]).spec
    sigmoid = json.loads(json.dumps(spec))
    sigmoid["model"]["block"]["mixer"]["output_gate_activation"] = "sigmoid"
    with pytest.raises(UserError, match=r"output_gate_activation: softplus"):
        specformer_hf.to_hf(specformer.build(sigmoid, seed=0), tmp_path / "sigmoid", family="laguna")
    channel = json.loads(json.dumps(spec))
    channel["model"]["block"]["mixer"]["output_gate_scope"] = "channel"  # the case has q/k/v biases
    with pytest.raises(UserError, match=r"per-element gate \(g_proj\) has no bias"):
        specformer_hf.to_hf(specformer.build(channel, seed=0), tmp_path / "channel", family="laguna")
