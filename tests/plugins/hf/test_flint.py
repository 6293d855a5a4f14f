"""Flint's router and shared expert, and what its export refuses (parity with transformers: the flint cases of
test_parity)."""

from __future__ import annotations

import json

import pytest
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError


def _imported(tmp_path):
    BY_NAME["flint"].build().save_pretrained(tmp_path / "in")
    return specformer_hf.import_hf(tmp_path / "in")


def test_the_router_has_no_selection_bias_and_the_shared_expert_no_gate(tmp_path):
    imported = _imported(tmp_path)
    ffn = imported.spec["model"]["block"]["ffn"]
    assert ffn["router"] == {"kind": "sigmoid_topk", "normalize": True, "selection_bias": False}
    assert (ffn["n_shared_experts"], ffn["shared_gate"]) == (1, False)
    names = set(imported.model.state_dict())
    assert not any(n.endswith(("selection_bias", "shared_gate.weight")) for n in names)
    out = specformer_hf.to_hf(imported.model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["mlp_only_layers"]) == ("flint", [0])


@pytest.mark.parametrize("change, needle", [
    (lambda ffn: ffn.update(shared_gate=True), r"one ungated shared expert \(n_shared_experts: 1, shared_gate: false\)"),
    (lambda ffn: ffn["router"].update(selection_bias=True), r"sigmoid_topk \(selection_bias: false, no groups"),
])
def test_export_refuses_a_gated_shared_expert_and_a_selection_bias(tmp_path, change, needle):
    spec = json.loads(json.dumps(_imported(tmp_path).spec))
    change(spec["model"]["block"]["ffn"])
    with pytest.raises(UserError, match=needle):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="flint")
