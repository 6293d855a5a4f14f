"""Apertus beyond the parity cases: xIELU's stored constants, another hidden_act, Apertus 1.5's pruned head."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import specformer_hf
from specformer.errors import UserError

from .hf_cases import BASE, Case

APERTUS = Case("apertus-small", "ApertusConfig", "ApertusForCausalLM",
               {**BASE, "num_key_value_heads": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})


def _saved(tmp_path, case: Case = APERTUS):
    model = case.build()
    case.save(model, tmp_path / "hf")
    return model, tmp_path / "hf"


def test_a_checkpoint_with_another_xielu_beta_is_refused_naming_it(tmp_path):
    _, folder = _saved(tmp_path)
    [shard] = folder.glob("*.safetensors")
    tensors = load_file(shard)
    assert tensors["model.layers.1.mlp.act_fn.beta"].item() == 0.5  # transformers saves the constant
    tensors["model.layers.1.mlp.act_fn.beta"] = torch.tensor(0.25)
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"layer 1: the checkpoint's xIELU beta is 0\.25, not 0\.5"):
        specformer_hf.from_hf(folder)


def test_another_hidden_act_is_a_fixed_activation_with_the_same_logits(tmp_path):
    theirs, folder = _saved(tmp_path, Case("apertus-relu2", APERTUS.config, APERTUS.model,
                                           {**APERTUS.kwargs, "hidden_act": "relu2"}))
    ours = specformer_hf.from_hf(folder).eval()
    assert ours.spec.model.block.ffn.activation == "relu2"
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids).logits, atol=1e-4, rtol=0)
    out = specformer_hf.to_hf(ours, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["hidden_act"] == "relu2"


def test_apertus1p5_text_refuses_a_pruned_head(tmp_path):
    folder = tmp_path / "pruned"
    case = Case("apertus1p5-pruned", "Apertus1p5TextConfig", "Apertus1p5TextForCausalLM",
                {**BASE, "output_vocab_size": 100, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}})
    case.save(case.build(), folder)
    with pytest.raises(UserError, match=r"output_vocab_size 100 prunes the LM head below vocab_size \(128\)"):
        specformer_hf.from_hf(folder)
