"""Export of specs written by hand: the family chosen, what is refused and why, dtypes and padded vocabularies."""

from __future__ import annotations

import json

import pytest
import torch

import specformer
import specformer_hf
from specformer.errors import UserError

from fixtures.tiny import tiny_spec


def _llama_spec(**changes):
    model = tiny_spec(
        vocab_size=96, d_model=64, context_length=64, tie_embeddings=False, positional={"kind": "rope", "theta": 10000.0},
        block={"norm": {"kind": "rmsnorm", "eps": 1e-5}, "ffn": {"kind": "swiglu", "hidden": 96}},
    )["model"]
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        target = model
        for p in parents:
            target = target[p]
        target[leaf] = value
    return {"model": model}


def _build(spec):
    model = specformer.build(spec, seed=0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # norms away from 1 so a misplaced norm shows
    return model.eval()


def _same_logits(model, out, *, tolerance=1e-4):
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, model.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(ids), reloaded(ids).logits.to(model(ids).dtype)
    assert theirs.shape == ours.shape
    assert (ours.float() - theirs.float()).abs().max().item() <= tolerance
    return reloaded


def test_a_plain_spec_exports_as_llama(tmp_path):
    model = _build(_llama_spec())
    out = specformer_hf.to_hf(model, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["dtype"] == "float32" and config["eos_token_id"] is None
    _same_logits(model, out)


def test_the_first_family_that_fits_is_chosen(tmp_path):
    # q/k/v biases without an o_proj bias: not Llama (one attention_bias for all four), but Qwen2.
    model = _build(_llama_spec(**{"block.mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "qkv_bias": True}}))
    out = specformer_hf.to_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen2"
    _same_logits(model, out)


def test_a_forced_family_names_the_part_it_cannot_express(tmp_path):
    model = _build(_llama_spec(**{"block.mixer.window": 8}))
    with pytest.raises(UserError) as info:
        specformer_hf.to_hf(model, tmp_path / "out", family="llama")
    assert "cannot be exported as Hugging Face Llama" in str(info.value)
    assert "model.block.mixer.window: 8 (the family gives None)" in str(info.value)
    out = specformer_hf.to_hf(model, tmp_path / "out")  # Mistral has sliding windows
    assert json.loads((out / "config.json").read_text())["model_type"] == "mistral"


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"positional": {"kind": "alibi"}}, "model.positional.kind: 'alibi' has no equivalent"),
        ({"block.layout": "postnorm"}, "model.block.layout.kind: 'postnorm' has no equivalent"),
        ({"logit_softcap": 30.0}, "model.logit_softcap: 30.0 (the family gives None)"),
        # ERNIE 4.5 and GLM rotate adjacent pairs, without sliding windows; Mistral has windows, rotating halves
        ({"positional": {"kind": "rope", "interleaved": True}, "block.mixer.window": 4}, "model.positional.interleaved"),
        ({"block.norm": {"kind": "scalenorm"}}, "model.block.norm.kind: 'scalenorm' has no equivalent"),
        ({"block.residual": {"kind": "mhc"}}, "model.block.residual: {'kind': 'specformer_layers.residual."),
        ({"positional": {"kind": "rope", "fraction": 0.5}, "block.mixer.window": 4, "block.mixer.qkv_bias": True},
         "Llama (llama): model.positional.fraction: 0.5: Hugging Face Llama rotates whole heads"),
    ],
    ids=["alibi", "postnorm", "final-softcap", "interleaved-rope", "scalenorm", "hyper-connections", "partial-rotary"],
)
def test_specs_no_family_can_express_are_refused_naming_the_part(tmp_path, changes, needle):
    model = _build(_llama_spec(**changes))
    with pytest.raises(UserError) as info:
        specformer_hf.to_hf(model, tmp_path / "out")
    message = str(info.value)
    assert message.startswith("no Hugging Face family can express this spec:") and "\n" not in message
    assert needle in "\n".join(info.value.details), info.value.details
    assert "specformer_layers." not in message  # no class path, no parameter dict: those are in the details
    assert not (tmp_path / "out").exists()


def test_per_layer_difference_is_named_by_layer(tmp_path):
    spec = _llama_spec()
    spec["model"]["layers"] = [{"select": 1, "ffn": {"hidden": 64}}]
    with pytest.raises(UserError) as info:
        specformer_hf.to_hf(_build(spec), tmp_path / "out", family="llama")
    assert "model.layers[*].ffn.hidden: differs between layers (96, 64)" in str(info.value)


def test_padded_vocabulary_is_cut_to_vocab_size(tmp_path):
    model = _build(_llama_spec(pad_vocab_to_multiple=64))
    assert model.embedding.weight.shape[0] == 128
    out = specformer_hf.to_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["vocab_size"] == 96
    _same_logits(model, out)


def test_bfloat16_model_exports_in_bfloat16_and_round_trips_exactly(tmp_path):
    model = _build(_llama_spec()).to(torch.bfloat16)
    out = specformer_hf.to_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    again = specformer_hf.from_hf(out)
    for name, tensor in model.state_dict().items():
        assert again.state_dict()[name].dtype == torch.bfloat16 and torch.equal(again.state_dict()[name], tensor)
    _same_logits(model, out, tolerance=0.1)  # bf16 arithmetic differs between implementations


def test_a_folder_holding_files_is_not_overwritten(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "model.safetensors.index.json").write_text("{}")
    with pytest.raises(UserError, match="already holds files;.* pass --force"):
        specformer_hf.to_hf(_build(_llama_spec()), tmp_path / "out")


def test_a_model_without_spec_is_refused(tmp_path):
    with pytest.raises(UserError, match="no .spec"):
        specformer_hf.to_hf(torch.nn.Linear(2, 2), tmp_path / "out")


def test_unknown_forced_family(tmp_path):
    with pytest.raises(UserError, match="unknown Hugging Face model_type 'llamma'.*did you mean 'llama'"):
        specformer_hf.to_hf(_build(_llama_spec()), tmp_path / "out", family="llamma")


def test_defaults_left_out_of_a_spec_compare_equal_to_their_values(tmp_path):
    # hidden, n_kv_heads, head_dim and scale left to their defaults: the exported config spells them
    # out, and reading it back must still count as the same model.
    spec = _llama_spec(**{"block.ffn": {"kind": "swiglu"}, "block.mixer": {"kind": "attention", "n_heads": 4}})
    model = _build(spec)
    out = specformer_hf.to_hf(model, tmp_path / "out", family="llama")
    config = json.loads((out / "config.json").read_text())
    assert config["intermediate_size"] == 192 and config["num_key_value_heads"] == 4 and config["head_dim"] == 16
    _same_logits(model, out)


def test_gpt_style_spec_exports_as_gpt2(tmp_path):
    spec = tiny_spec(vocab_size=96, d_model=64, positional="learned",
                     block={"layout": "prenorm", "norm": "layernorm",
                            "mixer": {"kind": "attention", "n_heads": 4, "qkv_bias": True, "out_bias": True},
                            "ffn": {"kind": "mlp", "activation": "gelu_tanh"}})
    model = _build(spec)
    out = specformer_hf.to_hf(model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "gpt2"
    _same_logits(model, out)
