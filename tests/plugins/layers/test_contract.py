"""The contract every layer component keeps, checked for every registered component of every layer kind.

Components are discovered from the registry, so a newly registered one is covered
without touching this file. A component with required params needs example params in
``VARIANTS`` (the test says so when they are missing); components may list several
variants to cover their options.

Each variant is placed in a tiny two-layer Decoder (see ``support.spec_with``) and must:
give logits of the right shape; keep the model's dtype in every module's output (float64
and bfloat16); be causal (changing later tokens never changes earlier outputs); pass
gradients to every parameter; build identically from the same seed; give through the
generation cache (laid out from what each attention declares it keeps) the logits of a
full recompute; and, in the slow suite, compile with ``torch.compile(fullgraph=True)`` to
the same results. Every registered attention is also checked with the cache against
every registered positional scheme, and against a per-layer mix of schemes.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specformer
from specformer.model.state import uses_positions
from specformer.model.attention import cache_slots_of
from specformer.model.state import state_slots_of, uses_positions

from .support import D_MODEL, HEAD_DIM, LAYER_KINDS, VOCAB, spec_with

PAIRS = HEAD_DIM // 2  # rotary channel pairs of the tiny spec's heads
CONTEXT = 32  # the tiny spec's context_length

#: Example params per component: each entry is one variant checked by every test below.
VARIANTS: dict[tuple[str, str], list[dict[str, Any]]] = {
    ("positional", "rope"): [{}, {"interleaved": True}, {"fraction": 0.5, "theta": 500.0}],
    ("rope_scaling", "linear"): [{"factor": 2.0}],
    ("rope_scaling", "proportional"): [{"fraction": 0.5}, {"fraction": 0.25, "factor": 2.0}],
    ("rope_scaling", "dynamic"): [{"factor": 2.0, "original_context_length": 8}],
    ("rope_scaling", "yarn"): [{"factor": 4.0, "original_context_length": 8},
                               {"factor": 4.0, "original_context_length": 8, "mscale": 0.7, "mscale_all_dim": 0.5}],
    ("rope_scaling", "llama3"): [{"factor": 4.0, "original_context_length": 16}],
    ("rope_scaling", "longrope"): [{"short_factor": [1.0 + i / 10 for i in range(PAIRS)],
                                    "long_factor": [2.0 + i for i in range(PAIRS)], "original_context_length": 8}],
    ("norm", "layernorm"): [{}, {"bias": False}, {"affine": False}],
    ("norm", "rmsnorm"): [{}, {"offset": 1.0}],
    ("ffn", "mlp"): [{}, {"activation": "relu2", "bias": False}],
    ("ffn", "moe"): [
        {"n_experts": 4, "top_k": 2, "hidden": 16},
        {"n_experts": 4, "top_k": 1, "hidden": 16, "routing": "topk_then_softmax", "gated": False, "activation": "gelu"},
        {"n_experts": 4, "top_k": 2, "hidden": 16, "normalize_topk": False, "n_shared_experts": 1, "shared_gate": True},
        {"n_experts": 4, "top_k": 2, "hidden": 16, "expert_bias": True, "swiglu_limit": 7.0, "router": {"kind": "softmax_topk", "bias": True}},
        {"n_experts": 4, "top_k": 2, "hidden": 16, "n_shared_experts": 1, "router": "sigmoid_topk"},
    ],
    ("ffn", "parallel"): [
        {"ffns": [{"kind": "geglu", "hidden": 16}, {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 8}]},
        {"ffns": [{"kind": "mlp", "hidden": 16}, {"kind": "swiglu", "hidden": 8}], "norm": "layernorm",
         "route_unnormed": False},
    ],
    ("router", "softmax_topk"): [{}, {"normalize": False, "bias": True, "scaling_factor": 2.0, "n_group": 2, "topk_group": 1}],
    ("router", "sigmoid_topk"): [{}, {"normalize": False, "bias": True, "scaling_factor": 2.5, "n_group": 2, "topk_group": 1}],
    ("mixer", "attention"): [
        {"n_heads": 4, "n_kv_heads": 2},
        {"n_heads": 4, "n_kv_heads": 1, "head_dim": 12, "window": 3, "qkv_bias": True, "out_bias": True},
        {"n_heads": 4, "qk_norm": "rmsnorm", "logit_softcap": 20.0, "scale": 0.3},
        {"n_heads": 4, "n_kv_heads": 2, "qk_norm": {"kind": "layernorm"}, "qk_norm_scope": "all", "backend": "eager"},
        {"n_heads": 4, "n_kv_heads": 2, "qk_norm": {"kind": "layernorm", "bias": False}, "qk_norm_scope": "per_head_weights"},
    ],
    ("mixer", "mla"): [
        {"n_heads": 4, "kv_lora_rank": 12, "qk_rope_head_dim": HEAD_DIM, "qk_nope_head_dim": 4, "v_head_dim": 6,
         "q_lora_rank": 10},
        {"n_heads": 2, "kv_lora_rank": 8, "qk_rope_head_dim": HEAD_DIM, "qk_nope_head_dim": 0, "v_head_dim": 16,
         "window": 3, "bias": True, "backend": "eager", "latent_norm": "layernorm"},
    ],
    ("ffn", "parallel"): [{"ffns": [{"kind": "geglu", "hidden": 16},
                                    {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 8}]}],
    ("mixer", "compressed"): [
        {"n_heads": 4, "head_dim": HEAD_DIM, "q_lora_rank": 8, "rope_dim": HEAD_DIM, "window": 3, "compress_rate": 2,
         "overlap": True, "index_heads": 2, "index_head_dim": HEAD_DIM, "index_topk": 2, "out_groups": 2, "out_rank": 4},
        {"n_heads": 2, "head_dim": 12, "q_lora_rank": 6, "rope_dim": HEAD_DIM, "window": 4, "compress_rate": 3,
         "sinks": False, "norm": "layernorm"},
        {"n_heads": 4, "head_dim": HEAD_DIM, "q_lora_rank": 8, "rope_dim": HEAD_DIM, "window": 3},
    ],
    ("mixer", "gated_deltanet"): [
        {"n_heads": 4},
        {"n_heads": 4, "n_key_heads": 2, "key_head_dim": 6, "value_head_dim": 8, "conv_kernel": 3, "conv_bias": True,
         "negative_eigenvalues": True, "dt_init_range": [0.001, 0.1], "chunk": 4},
    ],
    ("mixer", "short_conv"): [{}, {"kernel": 4, "bias": True, "conv_bias": True}, {"kernel": 2}],
    ("mixer", "kda"): [
        {"n_heads": 4},
        {"n_heads": 2, "head_dim": 6, "value_head_dim": 8, "conv_kernel": 3, "conv_bias": True, "decay_rank": 3,
         "gate_rank": 5, "norm_eps": 1e-5, "chunk": 4},
    ],
    ("mixer", "parallel"): [
        {"mixers": [{"kind": "attention", "n_heads": 4, "n_kv_heads": 2}], "in_multipliers": [0.5],
         "out_multipliers": [1.5]},
        {"mixers": [{"kind": "mla", "n_heads": 2, "kv_lora_rank": 8, "qk_rope_head_dim": HEAD_DIM,
                     "qk_nope_head_dim": 4, "v_head_dim": 6, "window": 3}]},
        {"mixers": [{"kind": "mamba2", "n_heads": 4, "head_dim": 6, "state_size": 8, "n_groups": 2, "chunk": 4,
                     "projection_multipliers": [0.5, 1.5, 0.9, 1.1, 0.7], "gated_norm": False},
                    {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": 5}],
         "in_multipliers": [0.5, 1.5], "out_multipliers": [2.0, 0.75]},
    ],
    ("mixer", "mamba2"): [
        {"n_heads": 4, "head_dim": 8, "state_size": 6, "chunk": 4},
        {"n_heads": 4, "head_dim": 6, "state_size": 5, "n_groups": 2, "conv_kernel": 3, "conv_bias": False, "bias": True,
         "dt_min": 0.01, "dt_max": 0.5, "norm_before_gate": True, "chunk": 3},
    ],
    ("mixer", "mamba"): [
        {"d_inner": 24, "state_size": 6, "chunk": 4},
        {"d_inner": 20, "state_size": 5, "dt_rank": 3, "conv_kernel": 3, "conv_bias": False, "bias": True,
         "bcdt_norm_eps": 1e-3, "chunk": 3},
        {"d_inner": 20, "state_size": 5, "dt_rank": 3, "bcdt_norm_eps": 1e-4, "bcdt_norm_weights": True, "chunk": 3},
    ],
    ("mixer", "rglru"): [
        {"width": 24, "gate_blocks": 3, "conv_kernel": 3, "chunk": 4},
        {"width": 20, "conv_kernel": 2, "bias": False, "activation": "gelu", "chunk": 3},
    ],
    ("mixer", "rwkv4"): [{}, {"width": 24}],
    ("mixer", "lightning"): [
        {"n_heads": 4, "chunk": 4},
        {"n_heads": 3, "head_dim": 6, "activation": "gelu", "norm_eps": 1e-5, "chunk": 3},
    ],
    ("mixer", "mlstm"): [
        {"n_heads": 4, "chunk": 4},
        {"n_heads": 3, "qk_dim": 9, "v_dim": 15, "bias": True, "gate_soft_cap": None, "norm_eps": 1e-5, "chunk": 3},
    ],
    ("mixer", "moa"): [
        {"n_experts": 4, "top_k": 2, "n_kv_heads": 2},
        {"n_experts": 3, "top_k": 1, "n_kv_heads": 3, "head_dim": 6, "out_bias": True, "aux_loss_coef": 0.0,
         "router": {"kind": "sigmoid_topk"}},
    ],
    ("mixer", "cca"): [
        {"n_heads": 4, "n_kv_heads": 2},
        {"n_heads": 3, "head_dim": 6, "depthwise_kernel": 3, "grouped_kernel": 4, "bias": True, "window": 5},
    ],
    ("layout", "parallel"): [{}, {"shared_norm": True}],
}


def _required(kind: str, name: str) -> list[str]:
    component = specformer.get_registry().get(kind, name)
    return [f for f, info in component.params.model_fields.items() if info.is_required()]


def _variants() -> list[Any]:
    registry = specformer.get_registry()
    cases = []
    for kind in LAYER_KINDS:
        for name in registry.names(kind):
            if (kind, name) not in VARIANTS and _required(kind, name):
                # Another plugin's component that needs params we cannot guess (ours must be covered:
                # test_every_component_is_covered).
                cases.append(pytest.param(kind, name, {}, id=f"{kind}-{name}", marks=pytest.mark.skip(
                    reason=f"{kind} {name!r} needs params {_required(kind, name)}; add them to VARIANTS")))
                continue
            for i, example in enumerate(VARIANTS.get((kind, name), [{}])):
                cases.append(pytest.param(kind, name, example, id=f"{kind}-{name}-{i}"))
    return cases


CASES = _variants()


def _build(kind: str, name: str, params: dict[str, Any], **kwargs: Any) -> specformer.Decoder:
    return specformer.build(spec_with(kind, {"kind": name, **params}), **kwargs)


def _tokens(batch: int = 2, length: int = 16, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_every_layer_kind_has_components() -> None:
    registry = specformer.get_registry()
    for kind in LAYER_KINDS:
        assert registry.names(kind), f"no {kind} component registered"


def test_every_component_is_covered() -> None:
    """A built-in component with required params is only checked once VARIANTS gives it example params."""
    registry = specformer.get_registry()
    uncovered = [f"{kind} {name!r} (required: {_required(kind, name)})" for kind in LAYER_KINDS
                 for name in registry.names(kind) if (kind, name) not in VARIANTS and _required(kind, name)
                 and registry.get(kind, name).plugin == "layers"]
    assert not uncovered, f"add example params to VARIANTS for: {', '.join(uncovered)}"
    stale = [key for key in VARIANTS if key[1] not in registry.names(key[0])]
    assert not stale, f"VARIANTS names components that are not registered: {stale}"


@pytest.mark.parametrize(("kind", "name", "params"), CASES)
def test_shapes(kind: str, name: str, params: dict[str, Any]) -> None:
    model = _build(kind, name, params, seed=0).eval()
    x = _tokens(3, 11)
    assert model(x).shape == (3, 11, VOCAB)
    assert model(x, last_only=True).shape == (3, 1, VOCAB)
    assert torch.isfinite(model(x)).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize(("kind", "name", "params"), CASES)
def test_dtype_is_preserved_by_every_module(kind: str, name: str, params: dict[str, Any], dtype: torch.dtype) -> None:
    model = _build(kind, name, params, seed=0, dtype=dtype).eval()
    wrong: list[str] = []

    def check(module_name: str):
        def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, torch.Tensor) and output.is_floating_point() and output.dtype != dtype:
                wrong.append(f"{module_name or 'model'} ({type(module).__name__}) -> {output.dtype}")
        return hook

    handles = [m.register_forward_hook(check(n)) for n, m in model.named_modules()]
    try:
        logits = model(_tokens())
    finally:
        for h in handles:
            h.remove()
    assert logits.dtype == dtype
    assert torch.isfinite(logits.float()).all()
    assert not wrong, f"modules changed the dtype: {wrong}"


@pytest.mark.parametrize(("kind", "name", "params"), CASES)
def test_causal(kind: str, name: str, params: dict[str, Any]) -> None:
    model = _build(kind, name, params, seed=0, dtype=torch.float64).eval()
    x = _tokens(2, 16)
    before = model(x)
    for t in (0, 6, 14):
        changed = x.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] + 1 + torch.arange(16 - t - 1)) % VOCAB
        after = model(changed)
        torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=1e-10, atol=1e-10)
        assert not torch.allclose(after[:, t + 1:], before[:, t + 1:]), "later outputs ignore later tokens"


@pytest.mark.parametrize(("kind", "name", "params"), CASES)
def test_gradients_reach_every_parameter(kind: str, name: str, params: dict[str, Any]) -> None:
    model = _build(kind, name, params, seed=0).train()
    x = _tokens(2, 16)
    logits = model(x)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.roll(-1, 1).flatten())
    aux = model.auxiliary_loss()
    if aux is not None:
        loss = loss + aux
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient reaches {missing}"


@pytest.mark.parametrize(("kind", "name", "params"), CASES)
def test_deterministic_given_seed(kind: str, name: str, params: dict[str, Any]) -> None:
    a = _build(kind, name, params, seed=7).eval()
    b = _build(kind, name, params, seed=7).eval()
    c = _build(kind, name, params, seed=8).eval()
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key
    x = _tokens()
    assert torch.equal(a(x), b(x))
    assert torch.equal(a(x), a(x)), "two forwards of the same model differ"
    if any(p.numel() > 1 for p in a.parameters()):
        assert any(not torch.equal(sa[k], sc[k]) for k in sa), "another seed gives the same weights"


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "name", "params"), CASES)
def test_compiles_fullgraph(kind: str, name: str, params: dict[str, Any]) -> None:
    torch._dynamo.reset()
    model = _build(kind, name, params, seed=0).eval()
    x = _tokens(2, 12)
    expected = model(x)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        got = compiled(x)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


# -- the cache contract: generation with the cache equals recompute ---------------------------------

#: Short enough that rope scalings that switch at original_context_length 8 (dynamic, longrope)
#: never switch: past it, cached keys legitimately differ from a recompute (as in transformers).
CACHE_LENGTH = 8


def _cached_equals_recompute(model: specformer.Decoder) -> None:
    """Logits fed through the generation cache (prefill 3, one chunk of 2, then one by one) equal a full forward."""
    from specformer_generate.cache import StaticKVCache

    model = model.double().eval()
    if all(cache_slots_of(a) is None and state_slots_of(a) is None for a in model.attention_modules()):
        pytest.skip("no layer keeps anything between forwards (no mixers): there is no cache to check")
    ids = _tokens(2, CACHE_LENGTH, seed=4)
    positions = torch.arange(CACHE_LENGTH).expand_as(ids)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=CACHE_LENGTH)
    out, start = [], 0
    for size in (3, 2, 1, 1, 1):
        out.append(model(ids[:, start:start + size], positions=positions[:, start:start + size], cache=cache))
        start += size
    torch.testing.assert_close(torch.cat(out, 1), model(ids), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("kind", "name", "params"), CASES)
def test_generation_with_the_cache_equals_recompute(kind: str, name: str, params: dict[str, Any]) -> None:
    _cached_equals_recompute(_build(kind, name, params, seed=0))


def _attention_by_positional() -> list[Any]:
    """Every attention variant with every positional scheme, and with a per-layer mix of schemes."""
    registry = specformer.get_registry()
    # A recurrent mixer reads no positions (uses_positions False): no scheme acts inside it, so it is not crossed with them.
    attentions = [(c.values[1], c.values[2]) for c in CASES if c.values[0] == "mixer" and not c.marks
                  and _reads_positions({"kind": c.values[1], **c.values[2]})]
    schemes: list[tuple[str, dict[str, Any]]] = [
        (name, {"kind": name, **VARIANTS.get(("positional", name), [{}])[0]}) for name in registry.names("positional")
    ]
    schemes += [(f"rope+{name}", {"kind": "rope", "scaling": {"kind": name, **VARIANTS.get(("rope_scaling", name), [{}])[0]}})
                for name in registry.names("rope_scaling")]

    def fitted(scheme: dict[str, Any], attention: dict[str, Any]) -> dict[str, Any]:
        """LongRoPE's factors sized for this attention's rotary channels (one per pair)."""
        scaling = scheme.get("scaling") or {}
        if scaling.get("kind") != "longrope":
            return scheme
        if "mixers" in attention:  # a parallel mixer: its attention carries the rotary heads
            attention = next(m for m in attention["mixers"] if m["kind"] in ("attention", "mla"))
        # moa has no n_heads: its heads are d_model / n_kv_heads wide by default.
        width = (attention.get("qk_rope_head_dim") or attention.get("head_dim")
                 or D_MODEL // attention.get("n_heads", attention.get("n_kv_heads", 1)))
        pairs = width // 2
        return {**scheme, "scaling": {**scaling, "short_factor": [1.0 + i / 10 for i in range(pairs)],
                                      "long_factor": [2.0 + i for i in range(pairs)]}}

    mix = [{"select": 0, "positional": "none"}, {"select": 1, "positional": {"kind": "rope", "theta": 500.0}},
           {"select": 2, "positional": "alibi"}]
    def built(attention: dict[str, Any]) -> Any:
        return registry.resolve("mixer", attention).make(d_model=D_MODEL, layer_index=0, n_layers=2,
                                                             context_length=CONTEXT)

    cases = []
    for i, (name, params) in enumerate(attentions):
        module = built({"kind": name, **params})
        if cache_slots_of(module) is None and state_slots_of(module) is None:
            continue  # no mixer at all (mixer: none): nothing reads positions or goes through a cache
        for label, scheme in schemes:
            marks = [pytest.mark.skip(reason=REFUSED[(name, label)])] if (name, label) in REFUSED else []
            cases.append(pytest.param({"kind": name, **params}, fitted(scheme, params), [], id=f"{name}-{i}-{label}",
                                      marks=marks))
        if uses_positions(module):  # a recurrence refuses a scheme of its own on a layer
            layer_mix = mix if (name, "alibi") not in REFUSED else [m for m in mix if m["positional"] != "alibi"]
            cases.append(pytest.param({"kind": name, **params}, {"kind": "rope"}, layer_mix,
                                      id=f"{name}-{i}-per-layer-mix"))
    return cases


#: Attention and positional schemes that cannot go together, refused by the attention with a message (tested
#: where the attention is), and why.
REFUSED = {
    ("compressed", "alibi"): "compressed attention turns keys (pooled entries included) and biases no scores",
    ("compressed", "relative_bias"): "compressed attention turns keys (pooled entries included) and biases no scores",
    ("compressed", "rope+dynamic"): "compressed attention turns entries at their blocks' positions: a length-"
                                    "dependent rope would turn them differently",
    ("compressed", "rope+longrope"): "compressed attention turns entries at their blocks' positions: a length-"
                                     "dependent rope would turn them differently",
}


def _reads_positions(attention: dict[str, Any]) -> bool:
    layer = specformer.get_registry().resolve("mixer", attention).make(d_model=D_MODEL, layer_index=0, n_layers=2,
                                                                            context_length=CONTEXT)
    return uses_positions(layer)


@pytest.mark.parametrize(("attention", "positional", "layers"), _attention_by_positional())
def test_every_attention_and_positional_generate_with_the_cache_as_recompute(
        attention: dict[str, Any], positional: dict[str, Any], layers: list[dict[str, Any]]) -> None:
    spec = spec_with("mixer", attention)
    spec["model"]["positional"] = positional
    if layers:
        spec["model"]["n_layers"] = 4
        spec["model"]["layers"] = layers
    model = specformer.build(spec, seed=0)
    _cached_equals_recompute(model)
    if layers:  # the mix is causal too
        x = _tokens(2, 10)
        changed = x.clone()
        changed[:, 6:] = (changed[:, 6:] + 1) % VOCAB
        torch.testing.assert_close(model(changed)[:, :6], model(x)[:, :6], rtol=1e-10, atol=1e-10)
