"""Llama 4's mapping in both directions beyond parity: every-other-layer experts as a slice (no list of layers),
a spec written by hand exported, and the specs Hugging Face Llama 4 cannot hold refused naming the part."""

from __future__ import annotations

import copy
import json

import pytest
import torch

import specformer
import specformer_hf
from specformer.errors import UserError

from fixtures.tiny import tiny_spec

MOE = {"kind": "moe", "n_experts": 4, "top_k": 1, "hidden": 32, "n_shared_experts": 1, "router": {"kind": "topk_sigmoid"}}


def _spec(n_layers: int = 4, moe_select: str | None = "1::2") -> dict:
    """Llama 4-shaped by hand: chunked rope layers with l2-normalised q/k, a NoPE layer every 4th, experts on ``moe_select``."""
    spec = tiny_spec(
        vocab_size=96, d_model=64, n_layers=n_layers, context_length=64, tie_embeddings=False,
        positional={"kind": "rope", "theta": 500000.0, "interleaved": True},
        block={"norm": {"kind": "rmsnorm", "eps": 1e-5},
               "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "chunk": 8,
                             "qk_norm": {"kind": "l2norm", "eps": 1e-5}},
               "ffn": {"kind": "swiglu", "hidden": 48} if moe_select else MOE},
        layers=[{"select": "3::4", "positional": "none",
                 "mixer": {"chunk": None, "qk_norm": None, "temperature_tuning": True, "temperature_floor_scale": 4,
                               "temperature_attn_scale": 0.5}}],
    )
    if moe_select:
        spec["model"]["layers"].append({"select": moe_select, "ffn": copy.deepcopy(MOE)})
    return spec


def _build(spec: dict) -> torch.nn.Module:
    model = specformer.build(spec, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def test_experts_every_other_layer_export_as_interleave_step_and_read_back_as_a_slice(tmp_path):
    from transformers import AutoModelForCausalLM

    model = _build(_spec(n_layers=6))
    out = specformer_hf.to_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama4_text" and config["interleave_moe_layer_step"] == 2
    assert config["moe_layers"] == [1, 3, 5] and config["no_rope_layers"] == [1, 1, 1, 0, 1, 1]
    assert config["layer_types"] == ["chunked_attention"] * 3 + ["full_attention"] + ["chunked_attention"] * 2
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 96, (2, 30), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (reloaded(ids).logits - model(ids)).abs().max().item() <= 1e-4
    again = specformer_hf.import_hf(out).model.spec.model
    assert [o.select for o in again.layers if o.ffn is not None] == ["1::2"]


def test_experts_on_even_layers_export_as_a_list_of_layers(tmp_path):
    out = specformer_hf.to_hf(_build(_spec(moe_select="0::2")), tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["moe_layers"] == [0, 2] and config["interleave_moe_layer_step"] == 1


def test_all_moe_needs_no_override(tmp_path):
    out = specformer_hf.to_hf(_build(_spec(moe_select=None)), tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["moe_layers"] == [0, 1, 2, 3] and config["interleave_moe_layer_step"] == 1
    assert all(o.ffn is None for o in specformer_hf.import_hf(out).model.spec.model.layers)


def _with(change) -> dict:
    spec = _spec()
    change(spec["model"])
    return spec


@pytest.mark.parametrize(("change", "needle"), [
    (lambda m: m["positional"].update(interleaved=False), "model.positional.interleaved"),
    (lambda m: m["layers"][0]["mixer"].update(qk_norm="l2norm"), "model.layers[*].mixer.qk_norm"),
    (lambda m: m["layers"][0]["mixer"].update(chunk=16), "several chunk sizes [8, 16]"),
    (lambda m: m["block"]["mixer"].update(temperature_tuning=True), "model.layers[*].mixer.temperature_tuning"),
    (lambda m: m["layers"][1]["ffn"].update(router={"kind": "sigmoid_topk"}), "model.block.ffn.router"),
    (lambda m: m["layers"][1]["ffn"].update(n_shared_experts=0), "model.block.ffn.n_shared_experts"),
    (lambda m: m["block"]["mixer"].update(qk_norm={"kind": "rmsnorm"}), "qk norm is l2norm per head"),
    (lambda m: m["block"].update(ffn=copy.deepcopy(MOE) | {"hidden": 40}), "the moe layers differ"),
    (lambda m: m["block"]["ffn"].update(kind="mlp"), "dense layers are gated"),
])
def test_what_llama4_cannot_hold_is_named(tmp_path, change, needle):
    with pytest.raises(UserError) as info:
        specformer_hf.to_hf(_build(_with(change)), tmp_path / "out", family="llama4_text")
    assert needle in str(info.value), str(info.value)
    assert not (tmp_path / "out").exists()
