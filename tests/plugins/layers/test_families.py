"""Whole models against transformers: each spec under specs/, shrunk, computes what the transformers
model of that family computes with the same weights.

This is where the layouts (parallel, sandwich, postnorm_inside), the MoE, qk-norm scopes,
soft-capping, the Gemma norm offset and embedding scale, partial rotary and RoPE scaling
meet an independent implementation of the real architectures. Weights go from a randomly
initialised (and perturbed) transformers model into ours by name; loading is strict, so
the two also have exactly the same parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch
import yaml

import specformer

from .test_specs import SHRINK, shrink

SPECS = Path(__file__).resolve().parents[3] / "specs"
TOY = dict(vocab_size=SHRINK["vocab_size"], hidden_size=SHRINK["d_model"], num_hidden_layers=3,
           max_position_embeddings=SHRINK["context_length"], num_attention_heads=4, intermediate_size=96)


def _config(cls_name: str, **kw: Any) -> Callable[[], Any]:
    def make() -> Any:
        import transformers

        return getattr(transformers, cls_name)(**{**TOY, **kw})
    return make


def _llama_layers(sd: dict[str, torch.Tensor], i: int, norms: dict[str, str]) -> dict[str, torch.Tensor]:
    """One transformers Llama-family layer's tensors under our names."""
    p, q = f"model.layers.{i}.", f"blocks.{i}."
    out = {q + "mixer.out.weight": sd[p + "self_attn.o_proj.weight"]}
    if p + "self_attn.qkv_proj.weight" in sd:  # Phi-3 fuses q, k and v in our order already
        out[q + "mixer.qkv.weight"] = sd[p + "self_attn.qkv_proj.weight"]
    else:
        out[q + "mixer.qkv.weight"] = torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
    if p + "self_attn.q_proj.bias" in sd:
        out[q + "mixer.qkv.bias"] = torch.cat([sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
    for n in ("q_norm", "k_norm"):
        if p + f"self_attn.{n}.weight" in sd:
            out[q + f"mixer.{n}.weight"] = sd[p + f"self_attn.{n}.weight"]
    for theirs, ours in norms.items():
        out[q + ours + ".weight"] = sd[p + theirs + ".weight"]
    if p + "mlp.gate.weight" in sd:  # a sparse MoE block
        out[q + "ffn.router.weight"] = sd[p + "mlp.gate.weight"]
        out[q + "ffn.experts_in"] = sd[p + "mlp.experts.gate_up_proj"]
        out[q + "ffn.experts_out"] = sd[p + "mlp.experts.down_proj"]
    elif p + "mlp.gate_up_proj.weight" in sd:  # Phi-3 fuses gate and up
        out[q + "ffn.gate_up.weight"] = sd[p + "mlp.gate_up_proj.weight"]
        out[q + "ffn.down.weight"] = sd[p + "mlp.down_proj.weight"]
    else:
        out[q + "ffn.gate_up.weight"] = torch.cat((sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]))
        out[q + "ffn.down.weight"] = sd[p + "mlp.down_proj.weight"]
    return out


PRENORM = {"input_layernorm": "attention_norm", "post_attention_layernorm": "ffn_norm"}
SANDWICH = {"input_layernorm": "attention_norm", "post_attention_layernorm": "attention_post_norm",
            "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "ffn_post_norm"}
POSTNORM_INSIDE = {"post_attention_layernorm": "attention_norm", "post_feedforward_layernorm": "ffn_norm"}


def llama_family(norms: dict[str, str]) -> Callable[[dict[str, torch.Tensor], int], dict[str, torch.Tensor]]:
    def convert(sd: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
        out = {"embedding.weight": sd["model.embed_tokens.weight"], "final_norm.weight": sd["model.norm.weight"]}
        if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd["model.embed_tokens.weight"]):
            out["lm_head.weight"] = sd["lm_head.weight"]
        for i in range(n_layers):
            out.update(_llama_layers(sd, i, norms))
        return out
    return convert


def gpt_neox(sd: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    out = {"embedding.weight": sd["gpt_neox.embed_in.weight"], "lm_head.weight": sd["lm_head.weight"],
           "final_norm.weight": sd["gpt_neox.final_layer_norm.weight"],
           "final_norm.bias": sd["gpt_neox.final_layer_norm.bias"]}
    for i in range(n_layers):
        p, q = f"gpt_neox.layers.{i}.", f"blocks.{i}."
        # GPT-NeoX's fused projection is per head [q_h; k_h; v_h]; ours is [all q; all k; all v].
        w = sd[p + "attention.query_key_value.weight"]
        b = sd[p + "attention.query_key_value.bias"]
        heads = 4
        out[q + "mixer.qkv.weight"] = w.view(heads, 3, -1, w.shape[-1]).transpose(0, 1).reshape(w.shape)
        out[q + "mixer.qkv.bias"] = b.view(heads, 3, -1).transpose(0, 1).reshape(b.shape)
        for theirs, ours in (("attention.dense", "mixer.out"), ("mlp.dense_h_to_4h", "ffn.fc_in"),
                             ("mlp.dense_4h_to_h", "ffn.fc_out"), ("input_layernorm", "attention_norm"),
                             ("post_attention_layernorm", "ffn_norm")):
            out[q + ours + ".weight"] = sd[p + theirs + ".weight"]
            out[q + ours + ".bias"] = sd[p + theirs + ".bias"]
    return out


def gpt2(sd: dict[str, torch.Tensor], n_layers: int) -> dict[str, torch.Tensor]:
    out = {"embedding.weight": sd["transformer.wte.weight"], "positional.table.weight": sd["transformer.wpe.weight"],
           "final_norm.weight": sd["transformer.ln_f.weight"], "final_norm.bias": sd["transformer.ln_f.bias"]}
    for i in range(n_layers):
        p, q = f"transformer.h.{i}.", f"blocks.{i}."
        for theirs, ours, conv1d in (("attn.c_attn", "mixer.qkv", True), ("attn.c_proj", "mixer.out", True),
                                     ("mlp.c_fc", "ffn.fc_in", True), ("mlp.c_proj", "ffn.fc_out", True),
                                     ("ln_1", "attention_norm", False), ("ln_2", "ffn_norm", False)):
            weight = sd[p + theirs + ".weight"]
            out[q + ours + ".weight"] = weight.T if conv1d else weight  # GPT-2's Conv1D stores (in, out)
            out[q + ours + ".bias"] = sd[p + theirs + ".bias"]
    return out


#: spec file -> (transformers config at toy size, weight converter, changes to both sides).
FAMILIES: dict[str, tuple[Callable[[], Any], Callable[..., dict[str, torch.Tensor]], dict[str, Any]]] = {
    "llama-2-7b.yaml": (_config("LlamaConfig", num_key_value_heads=4, tie_word_embeddings=False,
                                rms_norm_eps=1e-5), llama_family(PRENORM), {}),
    "llama-3.1-8b.yaml": (_config("LlamaConfig", num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                                  rms_norm_eps=1e-5, rope_parameters={
                                      "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 16}),
                          llama_family(PRENORM), {}),
    "mistral-7b.yaml": (_config("MistralConfig", num_key_value_heads=2, head_dim=16, sliding_window=8,
                                tie_word_embeddings=False, rms_norm_eps=1e-5), llama_family(PRENORM), {}),
    "mixtral-8x7b.yaml": (_config("MixtralConfig", num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                  num_experts_per_tok=2, tie_word_embeddings=False, rms_norm_eps=1e-5,
                                  rope_theta=1e6), llama_family(PRENORM), {}),
    "gemma-2b.yaml": (_config("GemmaConfig", num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
                              hidden_activation="gelu_pytorch_tanh"), llama_family(PRENORM), {}),
    "gemma-2-2b.yaml": (_config("Gemma2Config", num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
                                sliding_window=8, attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh"),
                        llama_family(SANDWICH), {"attn_softcap": 2.0, "final_softcap": 3.0}),
    "qwen2.5-0.5b.yaml": (_config("Qwen2Config", num_key_value_heads=2, tie_word_embeddings=True,
                                  rms_norm_eps=1e-6, rope_theta=1e6), llama_family(PRENORM), {}),
    "qwen3-0.6b.yaml": (_config("Qwen3Config", num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                                rms_norm_eps=1e-6, rope_theta=1e6), llama_family(PRENORM), {}),
    "olmo-2-1b.yaml": (_config("Olmo2Config", num_key_value_heads=4, tie_word_embeddings=False, rms_norm_eps=1e-6,
                               rope_theta=500000.0), llama_family(POSTNORM_INSIDE), {}),
    "phi-3-mini.yaml": (_config("Phi3Config", num_key_value_heads=4, sliding_window=8, tie_word_embeddings=False,
                                rms_norm_eps=1e-5, pad_token_id=0), llama_family(PRENORM), {}),
    "pythia-160m.yaml": (_config("GPTNeoXConfig", tie_word_embeddings=False, use_parallel_residual=True,
                                 hidden_act="gelu", layer_norm_eps=1e-5, rope_parameters={
                                     "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}),
                         gpt_neox, {}),
    "gpt2-124m.yaml": (lambda: __import__("transformers").GPT2Config(
        vocab_size=TOY["vocab_size"], n_positions=TOY["max_position_embeddings"], n_embd=TOY["hidden_size"],
        n_layer=3, n_head=4, n_inner=96), gpt2, {}),
}


def our_spec(name: str, changes: dict[str, Any]) -> dict[str, Any]:
    data = shrink(yaml.safe_load((SPECS / name).read_text()))
    data["model"]["n_layers"] = TOY["num_hidden_layers"]
    if "attn_softcap" in changes:
        data["model"]["block"]["mixer"]["logit_softcap"] = changes["attn_softcap"]
    if "final_softcap" in changes:
        data["model"]["logit_softcap"] = changes["final_softcap"]
    return data


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_logits_match_transformers(name: str) -> None:
    from transformers import AutoModelForCausalLM

    make_config, convert, changes = FAMILIES[name]
    config = make_config()
    torch.manual_seed(0)
    theirs = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for param in theirs.parameters():
            param.add_(torch.randn_like(param) * 0.1)  # norms away from 1 (or 0), weights large enough to matter
    ours = specformer.build(our_spec(name, changes)).eval()
    ours.load_state_dict(convert(theirs.state_dict(), TOY["num_hidden_layers"]), strict=True)
    x = torch.randint(0, TOY["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(x).logits
        got = ours(x)
    assert expected.abs().max() > 0.5, "logits too small for the comparison to mean anything"
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
