"""Which specs map onto llama.cpp's llama architecture: the demo's does; anything else is refused naming its part."""

from __future__ import annotations

import pytest

from specformer.spec import load_spec
from specformer_gguf import NoGgufMapping, llama_layout

from fixtures.tiny import tiny_spec

from conftest import SPECS


def test_the_demo_spec_maps_with_its_sizes() -> None:
    layout = llama_layout(load_spec(SPECS / "tiny.yaml"))
    assert (layout.n_layers, layout.d_model, layout.n_heads, layout.n_kv_heads, layout.head_dim) == (4, 128, 4, 2, 32)
    assert (layout.rope_theta, layout.norm_eps, layout.tied, layout.rope_interleaved) == (10000.0, 1e-6, True, False)


@pytest.mark.parametrize("changes, part", [
    ({"positional": {"kind": "alibi"}}, "model.positional"),
    ({"positional": {"kind": "rope", "fraction": 0.5}}, "model.positional.fraction"),
    ({"positional": {"kind": "rope", "scaling": {"kind": "linear", "factor": 2.0}}}, "model.positional.scaling"),
    ({"positional": {"kind": "rope", "scaling": {"kind": "yarn", "factor": 2.0, "original_context_length": 16}}}, "model.positional.scaling"),
    ({"logit_softcap": 30.0}, "model.logit_softcap"),
    ({"embedding_multiplier": 2.0}, "model.embedding_multiplier"),
    ({"block": {"norm": "layernorm"}}, "model.block.norm"),
    ({"block": {"norm": {"kind": "rmsnorm", "offset": 1.0}}}, "model.block.norm.offset"),
    ({"block": {"mixer": {"kind": "attention", "n_heads": 4, "window": 8}}}, "model.block.mixer.window"),
    ({"block": {"mixer": {"kind": "attention", "n_heads": 4, "qkv_bias": True}}}, "model.block.mixer.qkv_bias"),
    ({"block": {"mixer": {"kind": "attention", "n_heads": 4, "qk_norm": "rmsnorm"}}}, "model.block.mixer.qk_norm"),
    ({"block": {"ffn": {"kind": "mlp", "hidden": 64}}}, "model.block.ffn"),
    ({"block": {"ffn": {"kind": "swiglu", "hidden": 48, "activation": "gelu"}}}, "model.block.ffn.activation"),
    ({"final_norm": {"kind": "rmsnorm", "eps": 1e-3}}, "model.final_norm.eps"),
    ({"layers": [{"select": [1], "mixer": {"kind": "attention", "n_heads": 4, "window": 8}}]}, "model.layers[1].mixer"),
])
def test_a_part_llama_cpp_lacks_is_refused_by_name(changes, part) -> None:
    block = changes.pop("block", None)
    spec = load_spec(tiny_spec(block=block, **changes))
    with pytest.raises(NoGgufMapping) as caught:
        llama_layout(spec)
    assert caught.value.part.startswith(part), str(caught.value)
    assert str(caught.value).startswith(caught.value.part + ": ") and "\n" not in str(caught.value)

