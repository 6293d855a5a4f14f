"""specformer summary: counts and per-token costs by formula."""

from __future__ import annotations

import specformer


def test_dense_counts_by_formula(fresh_tiny_spec):
    s = specformer.summarize(fresh_tiny_spec)
    d, layers, vocab, hidden, heads, kv, hd, ctx = 32, 2, 97, 48, 4, 2, 8, 32
    attention = d * (heads + 2 * kv) * hd + heads * hd * d
    ffn = d * 2 * hidden + hidden * d
    norms = 2 * d
    assert s.params["mixer"] == layers * attention
    assert s.params["ffn"] == layers * ffn
    assert s.total == vocab * d + layers * (attention + ffn + norms) + d
    assert s.forward_flops_per_token == 2 * (layers * (attention + ffn) + vocab * d) + layers * 4 * heads * hd * ctx
    assert s.kv_bytes_per_token() == layers * 2 * kv * hd * 4


def test_mixture_of_experts_counts_only_active_experts(fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["ffn"] = {"kind": "moe", "n_experts": 4, "top_k": 1, "hidden": 16}
    dense_tiny = {**fresh_tiny_spec, "model": {**fresh_tiny_spec["model"], "block": {**fresh_tiny_spec["model"]["block"], "ffn": {"kind": "swiglu", "hidden": 16}}}}
    moe, dense = specformer.summarize(fresh_tiny_spec), specformer.summarize(dense_tiny)
    router = 32 * 4
    # One of four experts is active per token: the dense model's matmuls plus the router.
    assert moe.params["ffn"] == 2 * (4 * 3 * 32 * 16 + router)
    assert moe.forward_flops_per_token == dense.forward_flops_per_token + 2 * 2 * router


def test_sliding_window_caps_the_attention_term(fresh_tiny_spec):
    full = specformer.summarize(fresh_tiny_spec)
    fresh_tiny_spec["model"]["block"]["mixer"]["window"] = 8
    windowed = specformer.summarize(fresh_tiny_spec)
    assert full.forward_flops_per_token - windowed.forward_flops_per_token == 2 * 4 * 4 * 8 * (32 - 8)
