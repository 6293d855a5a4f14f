"""What the layers plugin registers, and that each registration documents itself."""

from __future__ import annotations

import pytest

import specformer

EXPECTED = {
    "positional": {"learned", "sinusoidal", "rope", "alibi", "relative_bias", "none"},
    "rope_scaling": {"linear", "dynamic", "yarn", "llama3", "longrope", "proportional"},
    "norm": {"layernorm", "rmsnorm", "scalenorm", "l2norm", "prediction_head", "gated", "none"},
    "ffn": {"mlp", "swiglu", "geglu", "reglu", "rwkv_channel_mix", "moe", "parallel", "none"},
    "mixer": {"attention", "mla", "compressed", "cca", "short_conv", "gated_deltanet", "kda", "mamba2", "mamba", "rglru", "rwkv4", "lightning", "mlstm", "moa", "parallel", "none"},
    "layout": {"prenorm", "postnorm", "parallel", "sandwich", "postnorm_inside"},
    "router": {"softmax_topk", "sigmoid_topk", "topk_sigmoid", "sqrtsoftplus_topk", "hash", "normed_softmax_topk", "biased_softmax_topk", "sparsemixer"},
    "residual": {"single", "mhc"},
    "indexer": {"lightning", "block_pooled"},
    "activation": {"xielu"},
    "linear": {"bitlinear"},
    "per_layer_input": {"per_layer_embedding"},
}

OURS = [c for c in specformer.get_registry() if c.plugin == "layers"]


def test_registered_names() -> None:
    by_kind: dict[str, set[str]] = {}
    for c in OURS:
        by_kind.setdefault(c.kind, set()).add(c.name)
    assert by_kind == EXPECTED


def test_rope_scaling_kind() -> None:
    kind = specformer.get_registry().kinds["rope_scaling"]
    assert kind.sizes == ("rotary_dim", "theta", "context_length")
    assert kind.doc


def test_activation_kind() -> None:
    kind = specformer.get_registry().kinds["activation"]
    assert kind.sizes == ()  # elementwise: made with no sizes
    assert kind.doc


def test_router_kind() -> None:
    kind = specformer.get_registry().kinds["router"]
    assert kind.sizes == ("d_model", "n_experts", "top_k", "vocab_size")
    assert kind.doc


@pytest.mark.parametrize("component", OURS, ids=lambda c: f"{c.kind}-{c.name}")
def test_documented(component) -> None:
    assert len(component.summary) > 20, "a one-line summary"
    assert component.paper and component.paper.startswith("https://"), "a link to the paper or source"
    assert component.source.startswith("specformer_layers."), component.source
    for name, field in component.params.model_fields.items():
        assert field.description and len(field.description) > 10, f"param {name!r} needs a description"
    schema = component.params.model_json_schema()
    assert schema.get("additionalProperties") is False


def test_every_module_in_the_plugin_is_registered_or_support() -> None:
    """A component class written but never registered would be dead code."""
    import pkgutil

    import specformer_layers

    registered = {c.source.split(" ")[0] for c in OURS} | {c.params.__module__ for c in OURS}  # "module (file:line)"
    support = {"specformer_layers.plugin", "specformer_layers.positional.fp32", "specformer_layers.ffn.activations",
               "specformer_layers.positional.rope_scaling.base", "specformer_layers.layouts.base",
               "specformer_layers.routers.base", "specformer_layers.layouts.per_layer_gate",
               "specformer_layers.attention.kernels", "specformer_layers.attention.flex",
               "specformer_layers.attention.tiled", "specformer_layers.attention.per_head_norm",
               "specformer_layers.attention.masking", "specformer_layers.attention.sparse",
               "specformer_layers.attention.block_pooling", "specformer_layers.attention.grouped_output",
               "specformer_layers.attention.differential",
               "specformer_layers.mixers.conv", "specformer_layers.mixers.documents",
               "specformer_layers.mixers.ssd", "specformer_layers.mixers.selective_scan",
               "specformer_layers.mixers.grouped_gated_norm",
               "specformer_layers.mixers.kernels",
               "specformer_layers.mixers.delta_rule", "specformer_layers.mixers.gated_norm",
               "specformer_layers.mixers.recurrent", "specformer_layers.mixers.conv_params",
               "specformer_layers.mixers.wkv", "specformer_layers.mixers.token_shift"}
    modules = {m.name for m in pkgutil.walk_packages(specformer_layers.__path__, "specformer_layers.") if not m.ispkg}
    assert modules - registered - support == set()


def test_registering_imports_only_the_params_modules() -> None:
    """Listing components needs the plugin and its Params, never a module of layers (those import torch)."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; import specformer_layers.plugin; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('specformer_layers'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    # A params module is named params.py, or <component>_params.py (mixers: one per mixer, conv_params shared).
    layers = [m for m in loaded if m != "specformer_layers.plugin" and not m.endswith((".params", "_params"))
              and not _is_package(m)]
    assert layers == [], f"importing the plugin imported {layers}"


def _is_package(module: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None
