"""Weight rules: each transform against the layout written out by hand, and import/export as inverses."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from specformer_hf.parts.base import selection
from specformer_hf.parts.windows import window_layers
from specformer_hf.rules import Copy, Fused, HeadInterleavedQKV, PerExpert, Site, Transposed, halves, qkv_sizes


def _site(**attention):
    block = SimpleNamespace(mixer=SimpleNamespace(**attention), ffn=SimpleNamespace(hidden=3, n_experts=2))
    return Site(model=SimpleNamespace(blocks=[block]), layer=0)


def test_head_interleaved_qkv_regroups_by_role():
    heads, head_dim, d = 2, 3, 5
    site = _site(n_heads=heads, head_dim=head_dim)
    # GPT-NeoX rows: head 0 [q0 k0 v0], head 1 [q1 k1 v1]; each block head_dim rows.
    blocks = {(h, role): torch.full((head_dim, d), float(10 * h + role)) for h in range(heads) for role in range(3)}
    neox = torch.cat([blocks[(h, role)] for h in range(heads) for role in range(3)])
    ours = HeadInterleavedQKV("a", "b").to_ours([neox], site)[0]
    expected = torch.cat([blocks[(h, role)] for role in range(3) for h in range(heads)])  # [q0 q1 k0 k1 v0 v1]
    assert torch.equal(ours, expected)
    assert torch.equal(HeadInterleavedQKV("a", "b").to_hf([ours], site)[0], neox)
    bias = torch.arange(3 * heads * head_dim, dtype=torch.float32)
    rule = HeadInterleavedQKV("a", "b")
    assert torch.equal(rule.to_hf(rule.to_ours([bias], site), site)[0], bias)


def test_fused_splits_by_the_module_sizes():
    site = _site(n_heads=4, n_kv_heads=1, head_dim=2)
    q, k, v = torch.randn(8, 5), torch.randn(2, 5), torch.randn(2, 5)
    rule = Fused(["q", "k", "v"], "qkv", sizes=qkv_sizes)
    fused = rule.to_ours([q, k, v], site)[0]
    assert torch.equal(fused, torch.cat([q, k, v]))
    assert all(torch.equal(a, b) for a, b in zip(rule.to_hf([fused], site), (q, k, v)))
    gate_up = Fused(["g", "u"], "gu", sizes=halves)
    g, u = torch.randn(3, 5), torch.randn(3, 5)
    assert [t.tolist() for t in gate_up.to_hf(gate_up.to_ours([g, u], site), site)] == [g.tolist(), u.tolist()]


def test_transposed_and_copy():
    w = torch.randn(3, 4)
    assert torch.equal(Transposed("a", "b").to_ours([w], _site())[0], w.t())
    assert torch.equal(Copy("a", "b").to_hf([w], _site())[0], w)


def test_per_expert_stacks_gate_and_up():
    site = _site()
    rule = PerExpert(["e.{j}.w1", "e.{j}.w3"], "experts_in", n_experts=lambda s: 2)
    assert rule.expand_at(site) == (("e.0.w1", "e.0.w3", "e.1.w1", "e.1.w3"), ("experts_in",))
    parts = [torch.randn(3, 5) for _ in range(4)]
    stacked = rule.to_ours(parts, site)[0]
    assert stacked.shape == (2, 6, 5)
    assert torch.equal(stacked[1], torch.cat([parts[2], parts[3]]))  # expert 1: [gate; up]
    assert all(torch.equal(a, b) for a, b in zip(rule.to_hf([stacked], site), parts))


def test_templates_expand_per_layer():
    rule = Copy("model.layers.{i}.x", "blocks.{i}.x")
    assert rule.per_layer and not Copy("a", "b").per_layer
    site = Site(model=None, layer=3)
    assert rule.expand_at(site) == (("model.layers.3.x",), ("blocks.3.x",))


def test_window_overrides_read_as_slices():
    assert selection([0, 2], 4) == "0::2"
    assert selection([1, 3, 5], 6) == "1::2"
    assert selection([2, 3], 4) == "2:"
    assert selection([1, 2], 4) == "1:3"
    assert selection([0, 1, 3], 4) == [0, 1, 3]
    assert selection([2], 4) == 2
    assert window_layers(8, [8, None, 8, None]) == [{"select": "1::2", "mixer": {"window": None}}]
    assert window_layers(None, [None, None]) == []
