"""AFMoE's refusals (parity with transformers: the afmoe cases of test_parity)."""

from __future__ import annotations

import json

import pytest
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError


def test_attention_biases_are_refused_naming_the_gate(tmp_path):
    BY_NAME["afmoe"].build().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "attention_bias": True}))
    with pytest.raises(UserError, match=r"'attention_bias' = True is not supported: .*AFMoE's gate_proj has none"):
        specformer_hf.import_hf(tmp_path)


def test_export_refuses_a_head_gate_and_a_router_without_selection_bias(tmp_path):
    BY_NAME["afmoe"].build().save_pretrained(tmp_path / "in")
    spec = specformer_hf.import_hf(tmp_path / "in").spec
    head = json.loads(json.dumps(spec))
    head["model"]["block"]["mixer"]["output_gate_scope"] = "head"
    with pytest.raises(UserError, match=r"output_gate_scope: channel"):
        specformer_hf.to_hf(specformer.build(head, seed=0), tmp_path / "head", family="afmoe")
    plain = json.loads(json.dumps(spec))
    plain["model"]["block"]["ffn"]["router"]["selection_bias"] = False
    with pytest.raises(UserError, match=r"sigmoid_topk \(no score bias, a selection bias\)"):
        specformer_hf.to_hf(specformer.build(plain, seed=0), tmp_path / "plain", family="afmoe")
