"""Qwen3-Next, Qwen3.5, Qwen3.5-MoE and OLMo Hybrid beyond the shared parity cases: the regrouping rules written
out index by index, the compact layer overrides, OLMo Hybrid's convolutions at unequal widths, and refusals."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from hf_cases import BASE, Case
from multimodal import check_language_model_import

import specformer
import specformer_hf
from specformer_hf.config import ConfigReader
from specformer_hf.parts.deltanet import GatedQuery, GroupedBA, GroupedQKVZ
from specformer_hf.family import get_families
from specformer_hf.rules import Site
from fixtures.tiny import tiny_spec

TOLERANCE = 1e-4


def _delta_site(*, key_heads: int, value_heads: int, dk: int, dv: int) -> Site:
    mixer = SimpleNamespace(n_heads=value_heads, n_kv_heads=key_heads, key_head_dim=dk, head_dim=dv, state_slots=())
    return Site(SimpleNamespace(blocks=[SimpleNamespace(mixer=mixer)]), 0)


def test_in_proj_qkvz_and_ba_regroup_as_transformers_splits_them():
    """Rows labelled by their index, so each output row says where it came from; the expectation follows
    transformers' view (Hk, 2 dk + 2 r dv) / (Hk, 2 r) and its split, written out head by head."""
    hk, hv, dk, dv, d = 2, 6, 3, 5, 1
    r = hv // hk
    site = _delta_site(key_heads=hk, value_heads=hv, dk=dk, dv=dv)
    width = 2 * dk + 2 * r * dv  # rows per key-head group
    qkvz = torch.arange(hk * width, dtype=torch.float64)[:, None].repeat(1, d)
    qkv, z = GroupedQKVZ("x", ("qkv", "z")).to_ours([qkvz], site)
    rows = []
    for g in range(hk):  # q of every key head, then k of every key head
        rows += [g * width + c for c in range(dk)]
    for g in range(hk):
        rows += [g * width + dk + c for c in range(dk)]
    value_rows, gate_rows = [], []
    for h in range(hv):  # value head h belongs to key head h // r, the (h % r)-th of its group
        g, j = divmod(h, r)
        value_rows += [g * width + 2 * dk + j * dv + c for c in range(dv)]
        gate_rows += [g * width + 2 * dk + r * dv + j * dv + c for c in range(dv)]
    assert qkv[:, 0].tolist() == rows + value_rows
    assert z[:, 0].tolist() == gate_rows
    assert torch.equal(GroupedQKVZ("x", ("qkv", "z")).to_hf([qkv, z], site)[0], qkvz)

    ba = torch.arange(hk * 2 * r, dtype=torch.float64)[:, None]
    b, a = GroupedBA("x", ("b", "a")).to_ours([ba], site)
    assert b[:, 0].tolist() == [h // r * 2 * r + h % r for h in range(hv)]
    assert a[:, 0].tolist() == [h // r * 2 * r + r + h % r for h in range(hv)]
    assert torch.equal(GroupedBA("x", ("b", "a")).to_hf([b, a], site)[0], ba)


@pytest.mark.parametrize("bias", [False, True])
def test_gated_q_proj_splits_query_and_gate_head_by_head(bias):
    heads, kv, hd = 3, 1, 4
    attention = SimpleNamespace(n_heads=heads, n_kv_heads=kv, head_dim=hd)
    site = Site(SimpleNamespace(blocks=[SimpleNamespace(mixer=attention)]), 0)
    shape = () if bias else (2,)
    q_proj = torch.arange(2 * heads * hd, dtype=torch.float64).reshape(-1, *([1] * len(shape))).expand(-1, *shape)
    k_proj, v_proj = torch.full((kv * hd, *shape), -1.0), torch.full((kv * hd, *shape), -2.0)
    rule = GatedQuery(("q", "k", "v"), ("qkv", "gate"))
    qkv, gate = rule.to_ours([q_proj, k_proj, v_proj], site)
    flat = lambda t: t if bias else t[:, 0]  # noqa: E731
    # transformers: q_proj(x).view(..., heads, 2 * hd).chunk(2): per head, hd query channels then hd gate channels.
    assert flat(qkv[: heads * hd]).tolist() == [h * 2 * hd + c for h in range(heads) for c in range(hd)]
    assert flat(gate).tolist() == [h * 2 * hd + hd + c for h in range(heads) for c in range(hd)]
    assert torch.equal(qkv[heads * hd:], torch.cat([k_proj, v_proj]))
    back = rule.to_hf([qkv, gate], site)
    for got, want in zip(back, (q_proj, k_proj, v_proj)):
        assert torch.equal(got, want)


def _read(config_class: str, **fields):
    import transformers

    config = getattr(transformers, config_class)(**fields).to_dict()
    family = get_families().get(config["model_type"])
    reader = ConfigReader(config, defaults=family.defaults, family=family.name)
    return family.to_spec(reader), reader


def test_layer_types_become_one_compact_override():
    spec, reader = _read("Qwen3NextConfig", num_hidden_layers=12)
    assert spec["block"]["mixer"]["kind"] == "gated_deltanet"
    assert [o["select"] for o in spec["layers"]] == ["3::4"]
    assert spec["layers"][0]["mixer"]["kind"] == "attention" and reader.unread() == []
    full, linear = "full_attention", "linear_attention"
    spec, _ = _read("Qwen3_5TextConfig", num_hidden_layers=5, layer_types=[full, linear, full, full, linear])
    assert spec["block"]["mixer"]["kind"] == "attention"  # the commoner type is the block's
    assert spec["layers"] == [{"select": "1::3", "mixer": spec["layers"][0]["mixer"]}]
    assert spec["layers"][0]["mixer"]["kind"] == "gated_deltanet"
    spec, _ = _read("Qwen3_5TextConfig", num_hidden_layers=7, layer_types=[full, full, linear, full, linear, linear, linear])
    assert [o["select"] for o in spec["layers"]] == [[0, 1, 3]]  # no slice says it: the list


#: Qwen3-Next-80B-A3B's config.json as transformers 4.57 wrote it: flat rope fields, full_attention_interval, no
#: layer_types.
QWEN3_NEXT_457 = {
    "architectures": ["Qwen3NextForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 5120, "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next", "moe_intermediate_size": 512,
    "norm_topk_prob": True, "num_attention_heads": 16, "num_experts": 512, "num_experts_per_tok": 10,
    "num_hidden_layers": 48, "num_key_value_heads": 2, "output_router_logits": False, "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 10000000, "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.57.0.dev0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_a_transformers_4_config_reads_as_the_spec_in_specs():
    import yaml
    from pathlib import Path

    from specformer_hf.specview import differences, math_view

    family = get_families().get("qwen3_next")
    reader = ConfigReader(QWEN3_NEXT_457, defaults=family.defaults, family=family.name)
    read = family.to_spec(reader)
    assert reader.unread(also_harmless=family.non_math_fields) == []
    spec = yaml.safe_load((Path(__file__).resolve().parents[3] / "specs" / "qwen3-next-80b-a3b.yaml").read_text())
    assert differences(math_view(specformer.load_spec(spec)), math_view(specformer.load_spec({"model": read}))) == []


def test_olmo_hybrid_layers_carry_their_layouts_and_nope_reads_as_no_positions():
    spec, reader = _read("OlmoHybridConfig", num_hidden_layers=8, rope_parameters={"rope_type": "default", "rope_theta": None})
    assert spec["positional"] == {"kind": "none"}
    assert spec["block"]["layout"] == "prenorm" and spec["block"]["mixer"]["negative_eigenvalues"] is True
    assert spec["layers"] == [{"select": "3::4", "mixer": spec["layers"][0]["mixer"], "layout": "postnorm_inside"}]
    assert reader.unread() == []


def test_qwen3_5_multimodal_rope_sections_are_read_without_a_warning():
    spec, reader = _read("Qwen3_5TextConfig", num_hidden_layers=4, rope_parameters={
        "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10],
        "mrope_interleaved": True})
    assert spec["positional"] == {"kind": "rope", "theta": 1e7, "fraction": 0.25}
    assert reader.unread() == []


def test_hidden_act_other_than_silu_is_refused_with_linear_layers():
    with pytest.raises(specformer.errors.UserError, match="hidden_act 'gelu' is not supported with linear_attention"):
        _read("Qwen3_5TextConfig", num_hidden_layers=4, hidden_act="gelu")


#: OLMo Hybrid with queries/keys (2 x 8 channels each) narrower than values (4 x 12): transformers' own save splits
#: the fused convolution into three equal parts (27, 27, 26 channels), where the real widths are 16, 16 and 48.
OLMO_UNEQUAL = Case("olmo_hybrid-unequal", "OlmoHybridConfig", "OlmoHybridForCausalLM",
                    {**BASE, "num_hidden_layers": 4, "num_key_value_heads": 2, "linear_num_key_heads": 2,
                     "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 12,
                     "linear_conv_kernel_dim": 3})


def test_olmo_hybrid_convolutions_are_read_in_any_split_and_written_at_their_real_widths(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    hf = OLMO_UNEQUAL.build()
    hf.save_pretrained(tmp_path / "hf")
    saved = load_file(tmp_path / "hf" / "model.safetensors")
    assert saved["model.layers.0.linear_attn.q_conv1d.weight"].shape[0] == 27  # transformers' equal thirds
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")
        model = specformer_hf.import_hf(tmp_path / "hf").model
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = hf(ids).logits
        assert (model(ids) - reference).abs().max().item() <= TOLERANCE
    out = specformer_hf.to_hf(model, tmp_path / "export")
    exported = load_file(out / "model.safetensors")
    widths = [exported[f"model.layers.0.linear_attn.{x}_conv1d.weight"].shape for x in "qkv"]
    assert widths == [(16, 1, 3), (16, 1, 3), (48, 1, 3)]
    # The norms under the names transformers saves: layer 0 is a Gated DeltaNet layer, layer 3 an attention layer.
    assert {"model.layers.0.attention_layer_norm.weight", "model.layers.0.feedforward_layer_norm.weight",
            "model.layers.3.feedforward_layer_norm.weight", "model.layers.3.post_feedforward_layernorm.weight"} <= set(exported)
    assert "model.layers.3.attention_layer_norm.weight" not in exported
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert (reloaded(ids).logits - reference).abs().max().item() <= TOLERANCE
    again = specformer_hf.import_hf(out).model
    for name, tensor in model.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name


def _tiny_hybrid(**attention_changes) -> dict:
    """A hand-written Qwen3.5-like spec: Gated DeltaNet sizes left to their defaults, gated attention every 2nd layer."""
    attention = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "output_gate": True,
                 "qk_norm": {"kind": "rmsnorm", "eps": 1e-6, "offset": 1.0}, "qk_norm_scope": "head", **attention_changes}
    return tiny_spec(
        vocab_size=128, d_model=64, n_layers=4, context_length=64, tie_embeddings=False,
        positional={"kind": "rope", "theta": 10000.0, "fraction": 0.25},
        block={"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": 1e-6, "offset": 1.0},
               "mixer": {"kind": "gated_deltanet", "n_heads": 4, "conv_kernel": 3},
               "ffn": {"kind": "swiglu", "hidden": 96}},
        layers=[{"select": "1::2", "mixer": attention}])


def test_a_hand_written_hybrid_spec_exports_and_runs_the_same_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    model = specformer.build(_tiny_hybrid(), seed=0).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    out = specformer_hf.to_hf(model, tmp_path / "export")
    hf = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(hf).__name__ == "Qwen3_5ForCausalLM"  # the first family that expresses it
    assert hf.config.layer_types == ["linear_attention", "full_attention"] * 2
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize(("family", "change", "message"), [
    ("qwen3_5_text", {"output_gate": False}, "always gates its output"),
    ("olmo_hybrid", {}, "OLMo Hybrid rotates whole heads"),
])
def test_what_a_family_cannot_hold_is_refused_by_name(tmp_path, family, change, message):
    model = specformer.build(_tiny_hybrid(**change), seed=0)
    with pytest.raises(specformer.errors.UserError, match=message):
        specformer_hf.to_hf(model, tmp_path / "export", family=family)


def test_olmo_hybrid_needs_both_layer_types(tmp_path):
    spec = _tiny_hybrid()
    del spec["model"]["layers"]
    spec["model"]["positional"] = "none"
    spec["model"]["block"]["norm"] = {"kind": "rmsnorm", "eps": 1e-6}
    spec["model"]["block"]["mixer"].update(norm_eps=1e-5, negative_eigenvalues=True)
    model = specformer.build(spec, seed=0)
    with pytest.raises(specformer.errors.UserError, match="needs at least one gated_deltanet layer and one attention layer"):
        specformer_hf.to_hf(model, tmp_path / "export", family="olmo_hybrid")


def test_a_multimodal_qwen3_5_checkpoint_imports_as_its_language_model(tmp_path):
    """The published Qwen3.5 checkpoints are Qwen3_5ForConditionalGeneration: text_config, model.language_model.*,
    a vision encoder, the head tied at the top level."""
    import transformers

    text = {**BASE, "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 16,
            "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "linear_key_head_dim": 8, "linear_value_head_dim": 12, "linear_conv_kernel_dim": 3,
            "tie_word_embeddings": False}
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 64,
              "patch_size": 4, "spatial_merge_size": 1, "temporal_patch_size": 1, "num_position_embeddings": 16}
    config = transformers.Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForConditionalGeneration(config).eval()
    check_language_model_import(hf, tmp_path, model_type="qwen3_5", text_class="Qwen3_5ForCausalLM")
