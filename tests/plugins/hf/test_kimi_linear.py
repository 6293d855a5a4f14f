"""Kimi Linear's config reading and writing beyond the parity cases: Moonshot's own config.json, and the refusals.

Parity with transformers (logits, generation, export, round trips) runs through hf_cases.py's
``# --- hybrid: Kimi Linear ---`` cases in test_parity.py; the real-shape spec's counts in
test_family_specs.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import specformer
from specformer.errors import UserError
from specformer_hf.config import ConfigReader
from specformer_hf.exporter import hf_config
from specformer_hf.family import get_families
from specformer_hf.specview import NotExpressible, SpecView, differences, math_view
from fixtures.tiny import tiny_spec

SPECS = Path(__file__).resolve().parents[3] / "specs"
FULL = [4, 8, 12, 16, 20, 24, 27]

#: Moonshot's config.json of Kimi-Linear-48B-A3B as published (the names transformers saves; fields it never reads).
MOONSHOT = {
    "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "bos_token_id": 163584,
    "eos_token_id": 163586, "pad_token_id": 163839, "dtype": "bfloat16", "first_k_dense_replace": 1, "head_dim": 72,
    "hidden_act": "silu", "hidden_size": 2304, "initializer_range": 0.02, "intermediate_size": 9216, "kv_lora_rank": 512,
    "linear_attn_config": {"full_attn_layers": FULL, "head_dim": 128, "num_heads": 32, "short_conv_kernel_size": 4,
                           "kda_layers": [i for i in range(1, 28) if i not in FULL]},
    "mla_use_nope": True, "model_max_length": 1048576, "moe_intermediate_size": 1024, "moe_layer_freq": 1,
    "moe_renormalize": True, "moe_router_activation_func": "sigmoid", "num_attention_heads": 32, "num_expert_group": 1,
    "num_experts": 256, "num_experts_per_token": 8, "num_hidden_layers": 27, "num_key_value_heads": 32,
    "num_nextn_predict_layers": 0, "num_shared_experts": 1, "q_lora_rank": None, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 10000.0,
    "routed_scaling_factor": 2.446, "tie_word_embeddings": False, "topk_group": 1, "use_cache": True,
    "v_head_dim": 128, "vocab_size": 163840,
}


def family() -> Any:
    return get_families().get("kimi_linear")


def read(config: dict[str, Any]) -> tuple[dict[str, Any], ConfigReader]:
    reader = ConfigReader(config, defaults=family().defaults, family=family().name)
    return family().to_spec(reader), reader


def test_moonshots_config_reads_as_the_real_shape_spec_with_every_field_understood() -> None:
    model, reader = read(MOONSHOT)
    assert reader.unread(also_harmless=family().non_math_fields) == []
    spec = specformer.load_spec(SPECS / "kimi-linear-48b-a3b.yaml")
    assert differences(math_view(spec), math_view(specformer.load_spec({"model": model}))) == []
    # The more common mixer is the block's; the latent-attention layers and the dense first layer are overrides.
    assert model["block"]["mixer"]["kind"] == "kda"
    assert [(o["select"], next(k for k in ("mixer", "ffn") if k in o)) for o in model["layers"]] == [
        ([3, 7, 11, 15, 19, 23, 26], "mixer"), (0, "ffn")]


@pytest.mark.parametrize(("change", "says"), [
    ({"hidden_act": "gelu"}, "'hidden_act' = 'gelu' is not supported: Kimi Delta Attention's short convolution"),
    ({"mla_use_nope": False}, "never rotates the latent attention's keys"),
    ({"num_local_experts": 8}, "sets both 'num_experts' (256) and 'num_local_experts' (8)"),
    ({"num_shared_experts": 0}, "always has a shared expert"),
    ({"moe_router_activation_func": "softmax"}, "scores experts with a sigmoid"),
    ({"layer_types": ["linear_attention"] * 26 + ["sliding_attention"]}, "must be linear_attention or full_attention"),
    ({"linear_attn_config": {**MOONSHOT["linear_attn_config"], "full_attn_layers": [4, 28]}}, "numbers layers 1 to 27"),
    ({"linear_attn_config": {**MOONSHOT["linear_attn_config"], "short_conv_kernel_size": 1}}, "needs a kernel of 2"),
])
def test_configs_it_cannot_reproduce_are_refused_in_one_line(change: dict[str, Any], says: str) -> None:
    with pytest.raises(UserError) as info:
        read({**MOONSHOT, **change})
    assert says in str(info.value) and "\n" not in str(info.value), str(info.value)


def _tiny(kda: dict[str, Any] | None = None, *, mla: dict[str, Any] | None = None) -> dict[str, Any]:
    attention = {"kind": "kda", "n_heads": 2, "head_dim": 16, "norm_eps": 1e-5, **(kda or {})}
    latent = {"kind": "mla", "n_heads": 2, "kv_lora_rank": 8, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8,
              "v_head_dim": 8, "latent_norm": {"kind": "rmsnorm", "eps": 1e-6}, **(mla or {})}
    ffn = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "n_shared_experts": 1, "aux_loss_coef": 0.0,
           "router": {"kind": "sigmoid_topk", "normalize": True, "scaling_factor": 1.0, "n_group": 1, "topk_group": 1}}
    return tiny_spec(vocab_size=64, n_layers=3, positional="none",
                     block={"norm": {"kind": "rmsnorm", "eps": 1e-5}, "mixer": attention, "ffn": ffn},
                     layers=[{"select": 1, "mixer": latent}, {"select": 0, "ffn": {"kind": "swiglu", "hidden": 48}}])


def config_of(data: dict[str, Any]) -> dict[str, Any]:
    return hf_config(family(), SpecView.of(specformer.load_spec(data)))


def test_a_hybrid_spec_writes_the_names_transformers_saves() -> None:
    config = config_of(_tiny())
    assert config["layer_types"] == ["linear_attention", "full_attention", "linear_attention"]
    assert config["mlp_layer_types"] == ["dense", "sparse", "sparse"]
    assert (config["linear_num_heads"], config["linear_head_dim"], config["linear_conv_kernel_dim"]) == (2, 16, 4)
    assert (config["model_max_length"], config["num_experts"], config["num_shared_experts"]) == (32, 4, 1)
    assert "max_position_embeddings" not in config and "num_local_experts" not in config


@pytest.mark.parametrize(("data", "where", "says"), [
    (_tiny({"conv_bias": True}), "model.layers[*].mixer", "no conv_bias"),
    (_tiny({"value_head_dim": 8}), "model.layers[*].mixer", "values, decay and gate ranks of head_dim"),
    (_tiny({"norm_eps": 1e-6}), "model.layers[*].mixer.norm_eps", "shares rms_norm_eps"),
    (_tiny(mla={"window": 4}), "model.layers[*].mixer", "no window"),
])
def test_specs_it_cannot_write_are_refused_naming_the_part(data: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(NotExpressible) as info:
        config_of(data)
    assert info.value.path == where and says in str(info.value), str(info.value)


def test_a_spec_with_rotary_positions_is_not_kimi_linear() -> None:
    data = _tiny()
    data["model"]["positional"] = "rope"
    with pytest.raises(NotExpressible, match="'rope' has no equivalent in Hugging Face Kimi Linear"):
        config_of(data)
