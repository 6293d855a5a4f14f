"""LFM2-MoE's router: expert_bias (a buffer the parity cases' shaking leaves at zero) picks the experts, and a
router without one is refused in one line."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from hf_cases import BY_NAME

import specformer_hf
from specformer.errors import UserError


def test_the_expert_bias_picks_the_experts_as_in_transformers(tmp_path):
    case = BY_NAME["lfm2_moe"]
    hf = case.build()
    with torch.no_grad():
        for layer in hf.model.layers[1:]:  # the moe layers: a bias large enough to change which experts win
            layer.feed_forward.expert_bias.copy_(torch.randn_like(layer.feed_forward.expert_bias) * 3.0)
    case.save(hf, tmp_path)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")
        imported = specformer_hf.import_hf(tmp_path)
    assert torch.equal(imported.model.blocks[2].ffn.router.selection_bias, hf.model.layers[2].feed_forward.expert_bias)
    ids = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = hf(ids).logits
        ours = imported.model(ids)
        hf.model.layers[2].feed_forward.expert_bias.zero_()
        unbiased = hf(ids).logits
    assert (reference - unbiased).abs().max() > 1e-2, "the bias must change the routing for the test to mean anything"
    assert (ours - reference).abs().max().item() <= 1e-4


def test_a_router_without_expert_bias_is_refused(tmp_path):
    case = BY_NAME["lfm2_moe"]
    case.save(case.build(), tmp_path)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "use_expert_bias": False}))
    with pytest.raises(UserError, match="use_expert_bias.*selection bias"):
        specformer_hf.import_hf(tmp_path)
