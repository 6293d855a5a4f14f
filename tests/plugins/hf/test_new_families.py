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

from fixtures.tiny import tiny_spec


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
    attention = imported.spec["model"]["block"]["mixer"]
    assert attention["qk_norm"] == {"kind": "layernorm", "eps": 1e-4, "bias": False}
    assert attention["qk_norm_scope"] == "per_head_weights"
    ours = imported.model.blocks[1].mixer
    theirs = hf.model.layers[1].self_attn
    for h in range(4):
        assert torch.equal(ours.q_norm[h].weight, theirs.q_layernorm.norms[h].weight)
    for h in range(2):
        assert torch.equal(ours.k_norm[h].weight, theirs.k_layernorm.norms[h].weight)


def test_stablelm_exports_only_per_head_qk_norms(tmp_path):
    spec = tiny_spec(vocab_size=64, n_layers=1, positional={"kind": "rope", "fraction": 0.5},
                     block={"layout": "prenorm", "norm": "layernorm",
                            "mixer": {"kind": "attention", "n_heads": 2, "qk_norm": {"kind": "layernorm", "bias": False},
                                      "qk_norm_scope": "head"}})
    with pytest.raises(UserError, match="qk_layernorm keeps separate weights for every head"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="stablelm")
    spec["model"]["block"]["mixer"].update(qk_norm={"kind": "layernorm", "bias": True}, qk_norm_scope="per_head_weights")
    with pytest.raises(UserError, match=r"qk_norm\.bias: True"):  # transformers' per-head LayerNorms have no bias
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="stablelm")


def test_cohere_exports_an_interleaved_rope_and_per_head_qk_norms_only(tmp_path):
    spec = tiny_spec(vocab_size=64, n_layers=1, logit_scale=0.5,
                     block={"layout": {"kind": "parallel", "shared_norm": True},
                            "norm": {"kind": "layernorm", "bias": False}, "mixer": {"kind": "attention", "n_heads": 2}})
    with pytest.raises(UserError, match="rotates adjacent pairs"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="cohere")
    spec["model"]["positional"]["interleaved"] = True
    spec["model"]["block"]["mixer"].update(qk_norm={"kind": "layernorm", "bias": False}, qk_norm_scope="head")
    with pytest.raises(UserError, match="use_qk_norm keeps separate weights for every head"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="cohere")
    spec["model"]["block"]["mixer"]["qk_norm_scope"] = "per_head_weights"
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="cohere")
    assert json.loads((out / "config.json").read_text())["use_qk_norm"] is True


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
    spec = tiny_spec(vocab_size=64, n_layers=1, positional={"kind": "rope", "fraction": 0.5},
                     block={"layout": "prenorm", "norm": "layernorm",
                            "mixer": {"kind": "attention", "n_heads": 2, **changes}})
    with pytest.raises(UserError, match=needle):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="stablelm")


def test_a_whole_head_rotary_stablelm_writes_its_fraction(tmp_path):
    """StableLM's default fraction is 0.25: a spec rotating whole heads must say 1.0 in the config."""
    spec = tiny_spec(vocab_size=64, n_layers=1,
                     block={"layout": "prenorm", "norm": "layernorm", "mixer": {"kind": "attention", "n_heads": 2}})
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
    spec = tiny_spec(vocab_size=64, block={"mixer": {"kind": "attention", "n_heads": 2}},
                     layers=[{"select": 1, "positional": "none"}])
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


@pytest.mark.parametrize(("case", "changes", "needle"), [
    # Qwen2-MoE's window becomes 0 without use_sliding_window; SmolLM3's flash kernel would not slide.
    ("qwen2_moe", {"layer_types": ["sliding_attention", "full_attention", "full_attention"]},
     "layer_types names sliding_attention layers but use_sliding_window is false"),
    ("smollm3", {"layer_types": ["full_attention", "sliding_attention"] * 2, "sliding_window": 8},
     "layer_types names sliding_attention layers but use_sliding_window is false"),
    ("smollm3", {"use_sliding_window": True, "sliding_window": None, "layer_types": ["full_attention", "sliding_attention"] * 2},
     "'sliding_window' must be an integer, got None"),
    ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 0}, "'sliding_window' must be a positive integer, got 0"),
    # Qwen2 and Qwen3 (transformers cannot run these either: no window for the sliding mask).
    ("qwen2", {"use_sliding_window": False, "layer_types": ["sliding_attention", "full_attention", "full_attention"]},
     "layer_types names sliding_attention layers but there is no window"),
    ("qwen3", {"sliding_window": None, "use_sliding_window": True, "layer_types": ["sliding_attention", "full_attention"]},
     "layer_types names sliding_attention layers but there is no window"),
    ("qwen3_moe", {"use_sliding_window": "yes"}, "'use_sliding_window' = 'yes' is not supported"),
])
def test_sliding_windows_that_transformers_cannot_run_are_refused(tmp_path, case, changes, needle):
    with pytest.raises(UserError, match=needle):
        specformer_hf.from_hf(_folder(tmp_path, case, **changes))


@pytest.mark.parametrize(("case", "changes", "windows"), [
    # Without use_sliding_window nothing slides, whatever sliding_window and max_window_layers say (Qwen1.5-MoE's config).
    # layer_types None: the default pattern (save_pretrained writes the one it computed).
    ("qwen2_moe", {"use_sliding_window": False, "sliding_window": 32768, "max_window_layers": 21, "layer_types": None},
     [None] * 3),
    ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 3, "layer_types": None},
     [4, None, 4]),
    ("qwen2_moe", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1, "layer_types": None},
     [4, None, None]),
    ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}, [4, 4, 4]),
    ("smollm3", {"use_sliding_window": True, "sliding_window": 4, "layer_types": None}, [None, 4, None, 4]),  # NoPE layers
    ("smollm3", {"use_sliding_window": True, "sliding_window": None, "layer_types": None}, [None] * 4),
])
def test_which_layers_slide_follows_transformers(tmp_path, case, changes, windows):
    from transformers import AutoConfig

    folder = _folder(tmp_path, case, **changes)
    model = specformer_hf.from_hf(folder)
    assert [block.mixer.window for block in model.blocks] == windows
    config = AutoConfig.from_pretrained(folder)  # transformers' own reading, where the config has one
    if hasattr(config, "layer_types"):
        assert [t == "sliding_attention" for t in config.layer_types] == [w is not None for w in windows]


def test_qwen3_moe_slides_every_layer_or_none(tmp_path):
    spec = tiny_spec(vocab_size=64,
                     block={"layout": "prenorm", "mixer": {"kind": "attention", "n_heads": 2, "qk_norm": "rmsnorm"},
                            "ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "normalize_topk": False}},
                     layers=[{"select": 0, "mixer": {"window": 4}}])
    with pytest.raises(UserError, match="slides every layer or none"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="qwen3_moe")


def test_transformers_gemma3_never_applies_attn_logit_softcapping():
    """The reason the Gemma 3 import refuses the field: transformers keeps it but no attention kernel gets it.

    If a later transformers applies it, this fails, and the family should map it as Gemma 2 does.
    """
    from dataclasses import replace

    ids = torch.randint(0, 128, (1, 20), generator=torch.Generator().manual_seed(0))
    case = BY_NAME["gemma3"]
    logits = []
    for cap in (None, 0.05):  # a cap this tight changes every score, were it applied
        model = replace(case, kwargs={**case.kwargs, "attn_logit_softcapping": cap}).build()
        model.config._attn_implementation = "eager"
        with torch.no_grad():
            logits.append(model(ids).logits)
    assert torch.equal(logits[0], logits[1])


def test_gemma3_attn_logit_softcapping_is_refused_and_never_written(tmp_path):
    with pytest.raises(UserError, match="'attn_logit_softcapping' = 50.0 is not supported: transformers' Gemma 3 stores it "
                                        "but never applies it"):
        specformer_hf.from_hf(_folder(tmp_path / "in", "gemma3", attn_logit_softcapping=50.0))
    model = specformer_hf.from_hf(_folder(tmp_path / "ok", "gemma3", attn_logit_softcapping=None))
    assert all(block.mixer.logit_softcap is None for block in model.blocks)
    capped = specformer.build(tiny_spec(
        vocab_size=64, n_layers=1, embedding_multiplier="sqrt_d_model",
        block={"layout": "sandwich", "norm": {"kind": "rmsnorm", "offset": 1.0},
               "mixer": {"kind": "attention", "n_heads": 2, "logit_softcap": 50.0,
                         "qk_norm": {"kind": "rmsnorm", "offset": 1.0}},
               "ffn": {"kind": "geglu", "hidden": 48, "activation": "gelu_tanh"}}), seed=0)
    with pytest.raises(UserError, match="does not soft-cap attention scores"):
        specformer_hf.to_hf(capped, tmp_path / "out", family="gemma3_text")


@pytest.mark.parametrize("case", ["qwen2_moe-sliding", "qwen3_moe-sliding"])
def test_a_moe_config_without_dense_layers_imports_without_warnings(tmp_path, case):
    """Their intermediate_size sizes only dense layers: with experts in every layer it is inert, and not reported."""
    import warnings

    BY_NAME[case].build().save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")
        specformer_hf.import_hf(tmp_path)


def test_deepseek_v3_ignores_what_transformers_ignores_and_refuses_a_partial_mtp_layer(tmp_path):
    """transformers ignores every ``model.layers.61.*`` tensor (the published MTP layer's index) whatever the
    config's depth, and so does the import; the MTP layer of this config (layer 3, imported as ``model.mtp``:
    tests/plugins/hf/test_mtp_import.py) given in part is refused, naming what is missing."""
    from safetensors.torch import load_file

    hf = BY_NAME["deepseek_v3"].build()
    hf.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    mtp = {"model.layers.61.eh_proj.weight": torch.ones(64, 128), "model.layers.61.enorm.weight": torch.ones(64),
           "model.layers.61.self_attn.kv_a_layernorm.weight": torch.ones(20)}
    save_file({**tensors, **mtp}, tmp_path / "model.safetensors")
    model = specformer_hf.from_hf(tmp_path)
    ids = torch.arange(12).reshape(1, 12)
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() <= 1e-4
    save_file({**tensors, "model.layers.3.enorm.weight": torch.ones(64)}, tmp_path / "model.safetensors")
    with pytest.raises(UserError, match=r"missing tensors: model\.layers\.3\.input_layernorm\.weight"):
        specformer_hf.from_hf(tmp_path)


def test_deepseek_v32_refuses_mlp_layer_types_it_cannot_build_and_an_indexer_it_cannot_write(tmp_path):
    """Dense layers after sparse ones are not a DeepSeek-V3.2 shape; an indexer turning adjacent pairs is not its
    indexer; and DeepSeek-V3 has no indexer, so a model with one is written as DeepSeek-V3.2 or refused."""
    with pytest.raises(UserError, match="mlp_layer_types must name every layer, dense ones first"):
        specformer_hf.from_hf(_folder(tmp_path / "in", "deepseek_v32", mlp_layer_types=["sparse", "dense", "sparse"]))
    model = specformer_hf.from_hf(_folder(tmp_path / "ok", "deepseek_v32"))
    spec = model.spec.to_dict()
    spec["model"]["block"]["mixer"]["indexer"]["interleaved"] = True
    paired = specformer.build(spec, seed=0)
    with pytest.raises(UserError, match="indexer is lightning, turns its rotary channels in halves"):
        specformer_hf.to_hf(paired, tmp_path / "out", family="deepseek_v32")
    with pytest.raises(UserError, match="latent attention has no indexer"):
        specformer_hf.to_hf(model, tmp_path / "v3", family="deepseek_v3")


def test_the_tied_deepseek_v32_case_ties_at_the_indexer_cut(tmp_path, monkeypatch):
    """test_parity's ``deepseek_v32-tied-cut`` would pass vacuously without ties: count the queries whose
    ``index_topk``-th best score is shared by more keys than the cut leaves room for (two indexer heads whose
    ReLUs both close score a key exactly 0), and check that the import breaks them as torch.topk does."""
    from specformer_layers.attention import indexer as indexer_module

    model = specformer_hf.from_hf(_folder(tmp_path, "deepseek_v32-tied-cut"))
    calls = []
    choose = indexer_module.top_slots

    def recording(scores, k, *, ties="first"):
        calls.append((scores, k, ties))
        return choose(scores, k, ties=ties)

    monkeypatch.setattr(indexer_module, "top_slots", recording)
    ids = torch.randint(0, model.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))  # test_parity's
    with torch.no_grad():
        model(ids)
    assert calls and {ties for _, _, ties in calls} == {"topk"}
    tied = 0
    for scores, k, _ in calls:
        cut = scores.topk(k, dim=-1).values[..., -1:]  # (B, rows, 1)
        tied += int(((scores >= cut).sum(-1) > k)[cut[..., 0].isfinite()].sum())
    assert tied >= 4, f"only {tied} queries tie at the cut: the case no longer tests tie-breaking"



# -- Phi, GPTBigCode ---------------------------------------------------------------------------------------

GPT_STYLE = tiny_spec(vocab_size=96, d_model=64, positional="learned",
                      block={"layout": "prenorm", "norm": "layernorm",
                             "mixer": {"kind": "attention", "n_heads": 4, "qkv_bias": True, "out_bias": True},
                             "ffn": {"kind": "mlp", "activation": "gelu_tanh"}})["model"]


def test_a_multi_query_gpt_style_spec_exports_as_gpt_bigcode(tmp_path):
    """One key/value head and learned positions: only GPTBigCode holds it (a GPT-2 spec stays GPT-2: test_export)."""
    spec = {"model": {**GPT_STYLE, "block": {**GPT_STYLE["block"], "mixer": {
        **GPT_STYLE["block"]["mixer"], "n_kv_heads": 1}}}}
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["multi_query"]) == ("gpt_bigcode", True)


def test_gpt_bigcode_refuses_key_value_heads_between_one_and_all(tmp_path):
    spec = {"model": {**GPT_STYLE, "block": {**GPT_STYLE["block"], "mixer": {
        **GPT_STYLE["block"]["mixer"], "n_kv_heads": 2}}}}
    with pytest.raises(UserError, match=r"n_kv_heads.*2 key/value heads: Hugging Face GPTBigCode has one \(multi_query\) "
                                        r"or one per query head \(4\)"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="gpt_bigcode")


def test_phi_exports_only_a_head_with_a_bias(tmp_path):
    spec = tiny_spec(vocab_size=64, n_layers=1, tie_embeddings=False, positional={"kind": "rope", "fraction": 0.5},
                     block={"layout": {"kind": "parallel", "shared_norm": True}, "norm": "layernorm",
                            "mixer": {"kind": "attention", "n_heads": 2, "qkv_bias": True, "out_bias": True},
                            "ffn": {"kind": "mlp", "hidden": 48, "bias": True}})
    with pytest.raises(UserError, match=r"lm_head_bias.*Phi's LM head always has a bias"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="phi")
    spec["model"]["lm_head_bias"] = True
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out")  # no other family has a head bias
    assert json.loads((out / "config.json").read_text())["model_type"] == "phi"


@pytest.mark.parametrize("changes, needle", [
    ({"tie_word_embeddings": True}, r"'tie_word_embeddings' = True is not supported: GPT-J's LM head has a bias"),
    ({"rotary_dim": 7}, r"'rotary_dim' = 7 is not supported: it must be an even number of channels from 2 to the head "
                        r"size \(16\)"),
    ({"rotary_dim": None}, r"'rotary_dim' = None is not supported"),  # transformers breaks with several heads
])
def test_gptj_import_refuses_what_it_cannot_reproduce(tmp_path, changes, needle):
    with pytest.raises(UserError, match=needle):
        specformer_hf.import_hf(_folder(tmp_path, "gptj", **changes))


def test_gptj_exports_only_interleaved_rotary_with_its_theta(tmp_path):
    spec = tiny_spec(vocab_size=64, n_layers=1, tie_embeddings=False, lm_head_bias=True,
                     positional={"kind": "rope", "fraction": 0.5},
                     block={"layout": {"kind": "parallel", "shared_norm": True}, "norm": "layernorm",
                            "mixer": {"kind": "attention", "n_heads": 2},
                            "ffn": {"kind": "mlp", "hidden": 48, "bias": True}})
    with pytest.raises(UserError, match=r"interleaved.*GPT-J always pairs adjacent channels"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="gptj")
    spec["model"]["positional"].update(interleaved=True, theta=500.0)
    with pytest.raises(UserError, match=r"GPT-J's rotary has theta 10000 and no scaling"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="gptj")
    spec["model"]["positional"]["theta"] = 10000.0
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out")  # the only family with this rope
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["rotary_dim"]) == ("gptj", 8)


@pytest.mark.parametrize("case, changes, needle", [
    ("falcon", {"alibi": True}, r"'alibi' = True is not supported: Falcon's ALiBi \(Falcon-RW\) divides the slopes by "
                                r"sqrt\(head_dim\) and rounds slope x position to bfloat16"),
    ("falcon", {"parallel_attn": False}, r"'parallel_attn' = False is not supported with new_decoder_architecture"),
    ("falcon-sequential", {"num_kv_heads": 2}, r"'num_kv_heads' = 2 is not supported without new_decoder_architecture "
                                               r"or multi_query"),
])
def test_falcon_import_refuses_what_transformers_does_otherwise(tmp_path, case, changes, needle):
    with pytest.raises(UserError, match=needle):
        specformer_hf.import_hf(_folder(tmp_path, case, **changes))


FALCON_STYLE = tiny_spec(vocab_size=64, n_layers=1,
                         block={"layout": "prenorm", "norm": "layernorm",
                                "ffn": {"kind": "mlp", "hidden": 48, "bias": False}})["model"]


@pytest.mark.parametrize("block, needle", [
    ({}, r"2 key/value heads in a sequential block: Hugging Face Falcon has one \(multi_query\) or one per query head"),
    ({"layout": {"kind": "parallel", "shared_norm": False}, "ffn": {"kind": "mlp", "hidden": 48, "bias": True}},
     r"Falcon's one bias switch covers q/k/v, the output projection and the MLP alike"),
])
def test_falcon_export_refuses_what_it_cannot_hold(tmp_path, block, needle):
    spec = {"model": {**FALCON_STYLE, "block": {**FALCON_STYLE["block"], **block}}}
    with pytest.raises(UserError, match=needle):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="falcon")


@pytest.mark.parametrize("layout, config", [
    ({"kind": "parallel", "shared_norm": False}, {"new_decoder_architecture": True, "num_ln_in_parallel_attn": 2}),
    ({"kind": "parallel", "shared_norm": True}, {"new_decoder_architecture": True, "num_ln_in_parallel_attn": 1}),
])
def test_grouped_query_parallel_specs_export_as_falcon_40b_blocks(tmp_path, layout, config):
    spec = {"model": {**FALCON_STYLE, "block": {**FALCON_STYLE["block"], "layout": layout}}}
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out")
    written = json.loads((out / "config.json").read_text())
    assert written["model_type"] == "falcon" and written["num_kv_heads"] == 2
    assert {key: written[key] for key in config} == config


# -- OPT ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes, needle", [
    ({"do_layer_norm_before": False}, r"'do_layer_norm_before' = False is not supported: post-norm OPT \(OPT-350m\) ends "
                                      r"without a final LayerNorm"),
    ({"_remove_final_layer_norm": True}, r"'_remove_final_layer_norm' = True is not supported"),
    ({"word_embed_proj_dim": 32}, r"'word_embed_proj_dim' = 32 is not supported: word embeddings of another width than "
                                  r"hidden_size need projections into and out of the stream \(project_in, project_out\)"),
])
def test_opt_import_refuses_what_specformer_cannot_build(tmp_path, changes, needle):
    with pytest.raises(UserError, match=needle):
        specformer_hf.import_hf(_folder(tmp_path, "opt", **changes))


def test_opt_reads_checkpoints_saved_without_the_model_prefix(tmp_path):
    """The published OPT checkpoints were saved from OPTModel: decoder.* tensors, the tied head absent."""
    hf = BY_NAME["opt-no-bias-no-affine"].build()
    hf.save_pretrained(tmp_path)
    tensors = {name.removeprefix("model."): t.contiguous() for name, t in hf.state_dict().items() if name != "lm_head.weight"}
    save_file(tensors, tmp_path / "model.safetensors")
    imported = specformer_hf.import_hf(tmp_path)
    assert imported.spec["model"]["positional"] == {"kind": "learned", "offset": 2}
    ids = torch.randint(0, 128, (1, 20))
    with torch.no_grad():
        assert (imported.model(ids) - hf(ids).logits).abs().max().item() <= 1e-4


def test_learned_positions_with_opt_offset_export_only_as_opt(tmp_path):
    spec = {"model": {**GPT_STYLE, "positional": {"kind": "learned", "offset": 2},
                      "block": {**GPT_STYLE["block"], "ffn": {"kind": "mlp", "activation": "relu"}}}}
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "opt"
    spec["model"]["positional"]["offset"] = 1
    with pytest.raises(UserError, match=r"model.positional.offset: 1: Hugging Face OPT's position table starts at row 2"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out2", family="opt")


# -- GPT-Neo -------------------------------------------------------------------------------------------------------


def test_gpt_neo_reads_attention_types_as_per_layer_windows(tmp_path):
    imported = specformer_hf.import_hf(_folder(tmp_path, "gpt_neo"))
    model = imported.spec["model"]
    assert model["block"]["mixer"]["scale"] == 1.0 and model["block"]["mixer"]["window"] == 8
    assert model["layers"] == [{"select": 0, "mixer": {"window": None}}]


@pytest.mark.parametrize("types, needle", [
    ([[["global", "sparse"], 1], [["local"], 1]], r"'attention_types' = .* must give 'global' or 'local' for each of the "
                                                  r"3 layers \(not sparse\)"),
    ([[["global", "local"], 2]], r"must give 'global' or 'local' for each of the 3 layers, not 4"),
    ([["global", 3]], r"'attention_types' = .* must give 'global' or 'local'"),
])
def test_gpt_neo_refuses_attention_types_that_do_not_name_each_layer(tmp_path, types, needle):
    with pytest.raises(UserError, match=needle):
        specformer_hf.import_hf(_folder(tmp_path, "gpt_neo", attention_types=types))


def test_an_unscaled_windowed_gpt_style_spec_exports_as_gpt_neo(tmp_path):
    """Local layers on every other layer from the second: attention_types is the shortest repeating pattern."""
    spec = {"model": {**GPT_STYLE, "n_layers": 4, "block": {**GPT_STYLE["block"], "mixer": {
        "kind": "attention", "n_heads": 4, "out_bias": True, "scale": 1.0}},
        "layers": [{"select": "1::2", "mixer": {"window": 6}}]}}
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "gpt_neo"
    assert (config["attention_types"], config["window_size"]) == ([[["global", "local"], 2]], 6)
    spec["model"]["block"]["mixer"]["scale"] = 0.5
    with pytest.raises(UserError, match=r"GPT-Neo never scales attention scores \(scale: 1\)"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out2", family="gpt_neo")


# -- CodeGen -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("changes, needle", [
    ({"tie_word_embeddings": True}, r"'tie_word_embeddings' = True is not supported: CodeGen's LM head has a bias"),
    ({"n_embd": 66, "n_head": 3}, r"'n_embd' = 66 is not supported: CodeGen splits q, k and v into 4 shards of "
                                  r"n_embd / 4 channels, so it must be a multiple of 4"),
])
def test_codegen_import_refuses_what_transformers_cannot_run(tmp_path, changes, needle):
    with pytest.raises(UserError, match=needle):
        specformer_hf.import_hf(_folder(tmp_path, "codegen", **changes))


def test_codegen_imports_keep_their_family_and_gptj_specs_stay_gptj(tmp_path):
    """CodeGen and GPT-J share their maths: an imported CodeGen exports as CodeGen, a spec from elsewhere as GPT-J."""
    imported = specformer_hf.import_hf(_folder(tmp_path / "in", "codegen"))
    out = specformer_hf.to_hf(imported.model, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["model_type"] == "codegen"
    spec = {"model": imported.spec["model"]}
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "fresh")
    assert json.loads((out / "config.json").read_text())["model_type"] == "gptj"
    spec["model"] = {**spec["model"], "d_model": 66,  # 6 heads of 11: a width GPT-J holds, CodeGen does not
                     "block": {**spec["model"]["block"], "mixer": {"kind": "attention", "n_heads": 6}}}
    with pytest.raises(UserError, match=r"model.d_model: 66: Hugging Face CodeGen splits q, k and v into 4 shards"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "odd", family="codegen")
@pytest.mark.parametrize("changes, needle", [
    ({"use_bias": True}, r"use_bias with tie_word_embeddings is not supported: the LM head tied to the embedding then "
                         r"has a bias"),
    ({"use_bias": True, "tie_word_embeddings": False},
     r"use_bias with moe_num_shared_experts > 0 is not supported: the shared experts then have biases"),
    ({"moe_layer_start_index": 3}, r"select no layer of 3: a model without experts is dense ERNIE 4.5"),
])
def test_ernie4_5_moe_import_refuses_what_specformer_cannot_build(tmp_path, changes, needle):
    with pytest.raises(UserError, match=needle) as caught:
        specformer_hf.import_hf(_folder(tmp_path, "ernie4_5_moe", **changes))
    assert "\n" not in str(caught.value)


def test_ernie4_5_moe_reads_its_expert_layers_and_writes_them_back(tmp_path):
    """Experts on every second layer up to index 3 (1 and 3 of 5); the others dense, biased with use_bias."""
    imported = specformer_hf.import_hf(_folder(tmp_path / "in", "ernie4_5_moe-interval-bias"))
    kinds = [type(block.ffn).__name__ for block in imported.model.blocks]
    assert kinds == ["GatedMLP", "MoE", "GatedMLP", "MoE", "GatedMLP"]
    assert imported.model.blocks[0].ffn.gate_up.bias is not None
    specformer_hf.to_hf(imported.model, tmp_path / "out", family="ernie4_5_moe")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (config["moe_layer_start_index"], config["moe_layer_end_index"], config["moe_layer_interval"]) == (1, 3, 2)
    assert config["moe_norm_min"] == 0.8


def test_ernie4_5_moe_export_refuses_expert_layers_it_cannot_place(tmp_path):
    spec = tiny_spec(n_layers=3, positional={"kind": "rope", "interleaved": True})
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16,
                                     "router": {"kind": "biased_softmax_topk"}}
    spec["model"]["layers"] = [{"select": 1, "ffn": {"kind": "swiglu", "hidden": 16}}]  # experts on 0 and 2
    with pytest.raises(UserError, match=r"moe on layers \[0, 2\]: Hugging Face ERNIE 4.5 MoE has experts on every "
                                        r"moe_layer_interval-th layer"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="ernie4_5_moe")
    spec["model"]["layers"] = []
    spec["model"]["block"]["ffn"]["router"] = {"kind": "sigmoid_topk"}
    with pytest.raises(UserError, match="routes with biased_softmax_topk"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="ernie4_5_moe")


def test_ernie4_5_moe_skips_the_multi_token_prediction_module_as_transformers_does(tmp_path):
    from safetensors.torch import load_file

    folder = _folder(tmp_path, "ernie4_5_moe")
    tensors = load_file(folder / "model.safetensors")
    save_file({**tensors, "model.mtp_linear_proj.0.weight": torch.ones(80, 160)}, folder / "model.safetensors")
    specformer_hf.import_hf(folder)
    save_file({**tensors, "model.layers.7.mlp.gate.weight": torch.ones(6, 80)}, folder / "model.safetensors")
    with pytest.raises(UserError, match=r"does not use.*model\.layers\.7"):
        specformer_hf.import_hf(folder)


@pytest.mark.parametrize("changes, needle", [
    ({"indexer_types": ["full", "shared", "full"]}, "layers [1] reuse an earlier layer's chosen keys"),
    ({"indexer_types": None, "index_topk_pattern": "FSS"}, "layers [1, 2] reuse"),
    ({"indexer_types": None, "index_topk_freq": 2, "index_skip_topk_offset": 1}, "layers [1] reuse"),
])
def test_glm_moe_dsa_refuses_shared_indexer_layers(tmp_path, changes, needle):
    """A 'shared' layer reads the keys an earlier layer's indexer chose (cross-layer top-k sharing, not in specformer)."""
    folder = _folder(tmp_path, "glm_moe_dsa", **changes)
    with pytest.raises(UserError, match="cross-layer top-k sharing") as caught:
        specformer_hf.import_hf(folder)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_glm_moe_dsa_reads_the_all_full_pattern_keywords(tmp_path):
    """transformers derives indexer_types from index_topk_freq / index_skip_topk_offset when the config has none."""
    folder = _folder(tmp_path, "glm_moe_dsa", indexer_types=None, index_topk_freq=1, index_skip_topk_offset=2)
    imported = specformer_hf.import_hf(folder)
    assert imported.spec["model"]["block"]["mixer"]["indexer"]["interleaved"] is True
