"""Every layout is a declaration over one base: its parts, in an order that fixes parameters() and the state dict."""

from __future__ import annotations

import pytest

import specformer

# The order parameters are registered in is the order an optimizer's saved state follows:
# a layout that reordered its parts would break resuming an older run.
EXPECTED = {
    "prenorm": ["attention_norm", "mixer", "ffn_norm", "ffn"],
    "postnorm": ["mixer", "attention_norm", "ffn", "ffn_norm"],
    "postnorm_inside": ["mixer", "attention_norm", "ffn", "ffn_norm"],
    "sandwich": ["attention_norm", "mixer", "attention_post_norm", "ffn_norm", "ffn", "ffn_post_norm"],
    "parallel": ["attention_norm", "mixer", "ffn_norm", "ffn"],
    "parallel-shared": ["attention_norm", "mixer", "ffn"],
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_layout_registers_its_parts_in_its_declared_order(fresh_tiny_spec, name):
    layout = {"kind": "parallel", "shared_norm": True} if name == "parallel-shared" else name
    fresh_tiny_spec["model"]["block"]["layout"] = layout
    block = specformer.build(fresh_tiny_spec, device="meta").blocks[0]
    order = list(dict.fromkeys(n.split(".")[0] for n, _ in block.named_parameters()))
    assert order == EXPECTED[name]
    norms = [p for p in EXPECTED[name] if p.endswith("norm")]
    assert all(type(getattr(block, n)).__name__ == "RMSNorm" for n in norms)
    assert len({id(getattr(block, n)) for n in norms}) == len(norms)  # one norm each, never shared by mistake

