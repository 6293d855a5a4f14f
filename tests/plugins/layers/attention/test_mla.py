"""Multi-head latent attention (``mla``): the formula written out here, transformers' DeepSeek-V3, the cache.

The formula (DeepSeek-V2, arXiv:2405.04434, section 2.1), per token t and head h:

    c_t   = norm(W_dkv x_t)                 latent, kv_lora_rank channels (cached)
    kr_t  = RoPE(W_kr x_t)                  rotary key, shared by all heads (cached)
    q_t   = W_uq norm(W_dq x_t)             [q_nope; q_rope] per head
    k_t,h = [W_uk,h c_t ; kr_t]             v_t,h = W_uv,h c_t
    o_t,h = sum_s softmax_s(q_t,h . k_s,h * scale) v_s,h     over s <= t
    o_t,h <- sigmoid(w_g,h . x_t) o_t,h                     with output_gate (Ling 3), one logit per head

A.X-K2's form (q_up_input normed_and_raw, output gate per channel from the query latent): with
a_t = W_dq x_t, u_t = [norm(a_t); a_t], the query is q_t = W_uq u_t and o_t,h,j <- sigmoid(w_g,h,j . u_t) o_t,h,j.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.model.summary import summarize
from specformer_layers.attention.params import LatentAttentionParams
from fixtures.tiny import tiny_spec

VOCAB = 53

MLA = {"kind": "mla", "n_heads": 4, "kv_lora_rank": 12, "qk_rope_head_dim": 4, "qk_nope_head_dim": 6,
       "v_head_dim": 5, "q_lora_rank": 10}


def mla_spec(attention: dict[str, Any] | None = None, positional: dict[str, Any] | None = None,
             n_layers: int = 2) -> dict[str, Any]:
    """A DeepSeek-V3-shaped model, all layers dense; awkward sizes (v_head_dim != qk head dims)."""
    return tiny_spec(vocab_size=VOCAB, n_layers=n_layers, context_length=64, tie_embeddings=False, init_std=0.2,
                     positional=positional or {"kind": "rope", "interleaved": True},
                     block={"norm": {"kind": "rmsnorm", "eps": 1e-6}, "mixer": {**MLA, **(attention or {})}})


def reference_mla(attn: Any, x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """The formula above, head by head, with interleaved rotary pairs computed as complex numbers."""
    B, T, _ = x.shape
    H, nope, rope, vd = attn.n_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim, attn.v_head_dim

    def rms(v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def rotate(v: torch.Tensor) -> torch.Tensor:  # v (..., T, rope), pairs (0,1), (2,3), ...
        freqs = theta ** (-torch.arange(0, rope, 2, dtype=torch.float64) / rope)
        angle = torch.arange(T, dtype=torch.float64)[:, None] * freqs  # (T, rope/2)
        pairs = torch.view_as_complex(v.reshape(*v.shape[:-1], rope // 2, 2).contiguous())
        return torch.view_as_real(pairs * torch.polar(torch.ones_like(angle), angle)).flatten(-2)

    c_and_kr = x @ attn.kv_a.weight.T
    c = rms(c_and_kr[..., : attn.kv_lora_rank], attn.kv_norm.weight)  # (B, T, r)
    kr = rotate(c_and_kr[..., attn.kv_lora_rank:])  # (B, T, rope)
    if attn.q_lora_rank is None:
        q = x @ attn.q_proj.weight.T  # (B, T, H*(nope+rope))
    else:
        a = x @ attn.q_a.weight.T  # (B, T, q_lora_rank)
        u = rms(a, attn.q_norm.weight)
        u = torch.cat((u, a), -1) if attn.q_up_raw else u  # (B, T, q_up_width)
        q = u @ attn.q_b.weight.T  # (B, T, H*(nope+rope))
    w_b = attn.kv_b.weight.view(H, nope + vd, attn.kv_lora_rank)
    outputs = []
    for h in range(H):
        q_h = q[..., h * (nope + rope):(h + 1) * (nope + rope)]
        q_h = torch.cat((q_h[..., :nope], rotate(q_h[..., nope:])), -1)
        k_h = torch.cat((c @ w_b[h, :nope].T, kr), -1)  # (B, T, nope + rope)
        v_h = c @ w_b[h, nope:].T  # (B, T, vd)
        scores = q_h @ k_h.transpose(1, 2) / math.sqrt(nope + rope)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o_h = torch.softmax(scores, -1) @ v_h  # (B, T, vd)
        source = u if attn.gate_from_query else x
        if attn.gate is not None and attn.gate_per_channel:
            o_h = o_h * torch.sigmoid(source @ attn.gate.weight[h * vd:(h + 1) * vd].T)  # (B, T, vd)
        elif attn.gate is not None:
            o_h = o_h * torch.sigmoid(source @ attn.gate.weight[h])[..., None]
        outputs.append(o_h)
    return torch.cat(outputs, -1) @ attn.out.weight.T


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_matches_the_formula(backend: str) -> None:
    model = specformer.build(mla_spec({"backend": backend}), seed=0, dtype=torch.float64).eval()
    attn = model.blocks[0].mixer
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ctx = model._context(torch.arange(9).expand(2, 9), cache=None, plain_causal=backend == "sdpa")
    # RoPE angles are float32 by design (specformer_layers.positional.fp32), hence not 1e-12.
    torch.testing.assert_close(attn(x, ctx), reference_mla(attn, x), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("q_lora_rank", [10, None])
def test_the_head_output_gate_matches_the_formula(q_lora_rank: int | None) -> None:
    """Each head's output times sigmoid of its own logit of the block input; sized() counts the gate's weights."""
    model = specformer.build(mla_spec({"output_gate": True, "q_lora_rank": q_lora_rank}), seed=0,
                             dtype=torch.float64).eval()
    attn = model.blocks[0].mixer
    assert attn.gate.weight.shape == (4, 32) and attn.gate.bias is None
    with torch.no_grad():
        attn.gate.weight.normal_(std=1.0)  # gates well away from one half
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ctx = model._context(torch.arange(9).expand(2, 9), cache=None, plain_causal=True)
    gated = attn(x, ctx)
    torch.testing.assert_close(gated, reference_mla(attn, x), rtol=1e-5, atol=1e-7)
    params = LatentAttentionParams(**{**{k: v for k, v in MLA.items() if k != "kind"}, "q_lora_rank": q_lora_rank},
                                   output_gate=True)
    assert params.sized(d_model=32).parameters == sum(p.numel() for p in attn.parameters())
    attn.gate = None
    assert (attn(x, ctx) - gated).abs().max() > 0.05  # the gate changes the output


@pytest.mark.parametrize("form", [
    {"q_up_input": "normed_and_raw", "output_gate": True, "output_gate_scope": "channel",
     "output_gate_input": "query_latent"},
    {"q_up_input": "normed_and_raw"},
    {"output_gate": True, "output_gate_scope": "channel", "q_lora_rank": None},
])
def test_axk2_query_and_channel_gate_match_the_formula(form: dict[str, Any]) -> None:
    """[norm(a); a] feeds the query (and the gate, from the query latent), one gate per value channel; sized() agrees."""
    model = specformer.build(mla_spec(form), seed=0, dtype=torch.float64).eval()
    attn = model.blocks[0].mixer
    width = 20 if form.get("q_up_input") else 10
    assert attn.q_lora_rank is None or attn.q_b.weight.shape == (4 * 10, width)
    if attn.gate is not None:
        assert attn.gate.weight.shape == (4 * 5, width if form.get("output_gate_input") else 32)
        with torch.no_grad():
            attn.gate.weight.normal_(std=1.0)
    x = torch.randn(2, 9, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ctx = model._context(torch.arange(9).expand(2, 9), cache=None, plain_causal=True)
    torch.testing.assert_close(attn(x, ctx), reference_mla(attn, x), rtol=1e-5, atol=1e-7)
    params = LatentAttentionParams(**{**{k: v for k, v in MLA.items() if k != "kind"}, **form})
    assert params.sized(d_model=32).parameters == sum(p.numel() for p in attn.parameters())


def test_query_latent_options_need_a_query_latent() -> None:
    for form in ({"q_up_input": "normed_and_raw"}, {"output_gate": True, "output_gate_input": "query_latent"}):
        with pytest.raises(ValueError, match="give q_lora_rank"):
            LatentAttentionParams(**{**{k: v for k, v in MLA.items() if k != "kind"}, **form, "q_lora_rank": None})


def test_without_query_compression_has_a_full_query_projection() -> None:
    model = specformer.build(mla_spec({"q_lora_rank": None}), seed=0)
    attn = model.blocks[0].mixer
    assert attn.q_proj.weight.shape == (4 * (6 + 4), 32)
    assert not hasattr(attn, "q_a")


def test_cache_keeps_the_latent_and_the_rotary_key() -> None:
    """bytes/token/layer = (kv_lora_rank + qk_rope_head_dim) x dtype size, in the summary and the real cache."""
    from specformer_generate.cache import StaticKVCache

    spec = mla_spec(n_layers=3)
    s = summarize(spec)
    assert s.kv_bytes_per_token(torch.bfloat16) == 3 * (12 + 4) * 2
    assert s.kv_bytes_per_token(torch.float32) == 3 * (12 + 4) * 4
    model = specformer.build(spec, seed=0)
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=10)
    positions_bytes = 10 * 8  # one slot-position table shared by the layers
    assert cache.nbytes == 3 * 10 * (12 + 4) * 4 + positions_bytes


def test_generation_with_the_cache_equals_recompute() -> None:
    from specformer_generate import generate

    model = specformer.build(mla_spec({"window": 5}), seed=3).eval()
    prompt = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(2))
    cached = generate(model, prompt, max_new_tokens=12)
    recomputed = generate(model, prompt, max_new_tokens=12, use_cache=False)
    assert torch.equal(cached, recomputed)


@pytest.mark.parametrize(("change", "where", "says"), [
    ({"qk_rope_head_dim": 5}, "model.block.mixer", "qk_rope_head_dim (5) must be even"),
    ({"kv_lora_rank": 0}, "model.block.mixer.kv_lora_rank", "greater than 0"),
    ({"latent_norm": "rope"}, "model.block.mixer.latent_norm.kind", "is a positional, not a norm"),
])
def test_bad_params_are_one_clear_line(change: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(SpecError) as info:
        specformer.load_spec(mla_spec(change))
    assert len(info.value.problems) == 1
    problem = info.value.problems[0]
    assert problem.path == where and says in problem.message, str(problem)


# -- transformers' DeepSeek-V3 on the same weights ---------------------------------------------------


def hf_deepseek_from(model: Any, rope_parameters: dict[str, Any]) -> Any:
    """``DeepseekV3ForCausalLM`` (every layer dense) holding ``model``'s weights."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    attn = model.blocks[0].mixer
    config = DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=len(model.blocks),
        num_attention_heads=attn.n_heads, num_key_value_heads=attn.n_heads, q_lora_rank=attn.q_lora_rank,
        kv_lora_rank=attn.kv_lora_rank, qk_rope_head_dim=attn.qk_rope_head_dim, qk_nope_head_dim=attn.qk_nope_head_dim,
        v_head_dim=attn.v_head_dim, first_k_dense_replace=len(model.blocks), n_routed_experts=4,
        moe_intermediate_size=16, max_position_embeddings=64, rope_interleave=True, tie_word_embeddings=False,
        rms_norm_eps=1e-6, rope_parameters=rope_parameters, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    hf = DeepseekV3ForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(model.embedding.weight)
        for ours, theirs in zip(model.blocks, hf.model.layers):
            a, t = ours.mixer, theirs.self_attn
            query = ((("q_proj", "q_proj"),) if a.q_lora_rank is None  # DeepSeek-V2-Lite: one full projection
                     else (("q_a", "q_a_proj"), ("q_norm", "q_a_layernorm"), ("q_b", "q_b_proj")))
            for mine, hf_name in (*query, ("kv_a", "kv_a_proj_with_mqa"), ("kv_norm", "kv_a_layernorm"),
                                  ("kv_b", "kv_b_proj"), ("out", "o_proj")):
                getattr(t, hf_name).weight.copy_(getattr(a, mine).weight)
            gate, up = ours.ffn.gate_up.weight.chunk(2, dim=0)
            theirs.mlp.gate_proj.weight.copy_(gate)
            theirs.mlp.up_proj.weight.copy_(up)
            theirs.mlp.down_proj.weight.copy_(ours.ffn.down.weight)
            theirs.input_layernorm.weight.copy_(ours.attention_norm.weight)
            theirs.post_attention_layernorm.weight.copy_(ours.ffn_norm.weight)
        hf.model.norm.weight.copy_(model.final_norm.weight)
        hf.lm_head.weight.copy_(model.lm_head.weight)
    hf.generation_config.eos_token_id = None
    hf.generation_config.bos_token_id = None
    return hf


YARN = {"kind": "rope", "interleaved": True,
        "scaling": {"kind": "yarn", "factor": 4.0, "original_context_length": 16, "mscale": 1.0, "mscale_all_dim": 0.8}}
CASES = {
    "plain": ({}, None, {"rope_type": "default", "rope_theta": 10000.0}),
    "yarn-mscale": ({"yarn_factor": 4.0, "yarn_mscale_all_dim": 0.8}, YARN,
                    {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
                     "mscale": 1.0, "mscale_all_dim": 0.8}),
    "no-q-lora": ({"q_lora_rank": None}, None, {"rope_type": "default", "rope_theta": 10000.0}),
}


@pytest.mark.parametrize("case", CASES)
def test_matches_transformers_deepseek_v3(case: str) -> None:
    attention, positional, rope_parameters = CASES[case]
    model = specformer.build(mla_spec(attention, positional), seed=0, dtype=torch.float64).eval()
    hf = hf_deepseek_from(model, rope_parameters)
    ids = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)
        from specformer_generate import generate

        prompt = ids[:, :6]
        ours = generate(model, prompt, max_new_tokens=10)
        theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=False, max_new_tokens=10,
                             min_new_tokens=10)
    assert torch.equal(ours, theirs)



def test_summary_reports_cache_bytes_and_total_against_active_parameters(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A DeepSeek-shaped spec: MLA and a routed MoE, 2 of 4 experts per token (each expert 3 x 16 x 32 weights)."""
    import yaml

    from specformer.cli.main import main

    spec = mla_spec()
    spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16}
    s = summarize(spec)
    assert s.total == specformer.build(spec, seed=0).num_parameters()
    assert s.active == s.total - 2 * (4 - 2) * 3 * 16 * 32  # two layers, two experts each left out
    assert s.to_dict()["active_params"] == s.active
    path = tmp_path / "deepseek-like.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["summary", str(path)]) == 0
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert f"active / token {s.active:,} {100 * s.active / s.total:.1f}%" in lines
    assert "KV cache / token 128 B fp32, 64 B bf16" in lines  # 2 layers x (12 + 4) values x 4 bytes


def test_an_inspector_receives_the_attention_probabilities() -> None:
    from specformer_eval import capture

    model = specformer.build(mla_spec(), seed=0, dtype=torch.float64).eval()
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(0))
    plain = model(ids)
    with capture(model, attention=True) as cap:
        observed = model(ids)
    torch.testing.assert_close(observed, plain, rtol=1e-10, atol=1e-10)  # the eager path computes the same
    weights = cap.attention[1]
    assert weights.shape == (1, 4, 7, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 7, dtype=torch.float64))
    assert torch.all(weights.triu(1) == 0)  # causal
