"""What the families added from declarative parts refuse, each with one clear line (their parity runs in test_parity)."""

from __future__ import annotations

import json

import pytest
import torch
from hf_cases import BY_NAME
from safetensors.torch import save_file

import specformer
import specformer_hf
from specformer.errors import UserError


def _folder(tmp_path, case_name: str, **changes):
    """A transformers-saved folder of ``case_name`` whose config.json then gets ``changes``."""
    hf = BY_NAME[case_name].build()
    hf.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    return tmp_path


def test_stablelm_qk_layernorm_imports_as_per_head_weights(tmp_path):
    """StableLM 2 12B: one bias-free LayerNorm per query and per key head, eps layer_norm_eps (parity: test_parity)."""
    hf = BY_NAME["stablelm-qk_layernorm"].build()
    hf.save_pretrained(tmp_path)
    imported = specformer_hf.import_hf(tmp_path)
    attention = imported.spec["model"]["block"]["attention"]
    assert attention["qk_norm"] == {"kind": "layernorm", "eps": 1e-4, "bias": False}
    assert attention["qk_norm_scope"] == "per_head_weights"
    ours = imported.model.blocks[1].attention
    theirs = hf.model.layers[1].self_attn
    for h in range(4):
        assert torch.equal(ours.q_norm[h].weight, theirs.q_layernorm.norms[h].weight)
    for h in range(2):
        assert torch.equal(ours.k_norm[h].weight, theirs.k_layernorm.norms[h].weight)


def test_stablelm_exports_only_per_head_qk_norms(tmp_path):
    spec = {"model": {
        "vocab_size": 64, "d_model": 32, "n_layers": 1, "context_length": 32, "positional": {"kind": "rope", "fraction": 0.5},
        "block": {"layout": "prenorm", "norm": "layernorm",
                  "attention": {"kind": "attention", "n_heads": 2, "qk_norm": {"kind": "layernorm", "bias": False},
                                "qk_norm_scope": "head"},
                  "ffn": {"kind": "swiglu", "hidden": 48}},
    }}
    with pytest.raises(UserError, match="qk_layernorm keeps separate weights for every head"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="stablelm")
    spec["model"]["block"]["attention"].update(qk_norm={"kind": "layernorm", "bias": True}, qk_norm_scope="per_head_weights")
    with pytest.raises(UserError, match=r"qk_norm\.bias: True"):  # transformers' per-head LayerNorms have no bias
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="stablelm")


def test_stablelm_without_rope_parameters_rotates_a_quarter_of_each_head(tmp_path):
    folder = _folder(tmp_path, "stablelm")
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters")
    (folder / "config.json").write_text(json.dumps(config))
    spec = specformer_hf.import_hf(folder).spec
    assert spec["model"]["positional"]["fraction"] == 0.25  # StableLmConfig's default, not whole heads


@pytest.mark.parametrize(("changes", "needle"), [
    ({"head_dim": 8}, r"head_dim = d_model / n_heads"),
    ({"qkv_bias": True, "out_bias": True}, r"out_bias.*no o_proj bias"),
])
def test_stablelm_export_refuses_what_it_cannot_hold(tmp_path, changes, needle):
    spec = {"model": {
        "vocab_size": 64, "d_model": 32, "n_layers": 1, "context_length": 32,
        "positional": {"kind": "rope", "fraction": 0.5},
        "block": {"layout": "prenorm", "norm": "layernorm", "attention": {"kind": "attention", "n_heads": 2, **changes},
                  "ffn": {"kind": "swiglu", "hidden": 48}},
    }}
    with pytest.raises(UserError, match=needle):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="stablelm")


def test_a_whole_head_rotary_stablelm_writes_its_fraction(tmp_path):
    """StableLM's default fraction is 0.25: a spec rotating whole heads must say 1.0 in the config."""
    spec = {"model": {
        "vocab_size": 64, "d_model": 32, "n_layers": 1, "context_length": 32, "positional": {"kind": "rope"},
        "block": {"layout": "prenorm", "norm": "layernorm", "attention": {"kind": "attention", "n_heads": 2},
                  "ffn": {"kind": "swiglu", "hidden": 48}},
    }}
    model = specformer.build(spec, seed=0)
    out = specformer_hf.to_hf(model, tmp_path / "out", family="stablelm")
    assert json.loads((out / "config.json").read_text())["rope_parameters"]["partial_rotary_factor"] == 1.0
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.arange(20).reshape(1, 20) % 64
    with torch.no_grad():
        assert (reloaded(ids).logits - model(ids)).abs().max().item() <= 1e-4


def test_per_layer_positions_are_not_dropped_by_a_one_rope_family(tmp_path):
    """A NoPE layer in a Llama-shaped spec: every one-rope family refuses it rather than export it with rope."""
    spec = {"model": {
        "vocab_size": 64, "d_model": 32, "n_layers": 2, "context_length": 32, "positional": {"kind": "rope"},
        "block": {"layout": "prenorm", "norm": "rmsnorm", "attention": {"kind": "attention", "n_heads": 2},
                  "ffn": {"kind": "swiglu", "hidden": 48}},
        "layers": [{"select": 1, "positional": "none"}],
    }}
    model = specformer.build(spec, seed=0)
    with pytest.raises(UserError, match=r"model\.layers\[1\]\.positional: 'none' differs from model\.positional"):
        specformer_hf.to_hf(model, tmp_path / "llama", family="llama")
    # SmolLM3 is the family with NoPE layers: chosen when none is forced, and transformers computes the same logits.
    out = specformer_hf.to_hf(model, tmp_path / "any")
    assert json.loads((out / "config.json").read_text())["no_rope_layers"] == [1, 0]
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == "SmolLM3ForCausalLM"
    ids = torch.arange(24).reshape(1, 24) % 64
    with torch.no_grad():
        assert (reloaded(ids).logits - model(ids)).abs().max().item() <= 1e-4
