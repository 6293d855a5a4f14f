"""Does a spec map onto llama.cpp's ``llama`` architecture, and with which hyperparameters?

llama.cpp's llama graph is fixed: token embedding, then per layer a pre-norm RMSNorm, attention
(grouped-query, rotary positions on every channel, no biases), a pre-norm RMSNorm and a SwiGLU
feed-forward, each added to a single residual stream; a final RMSNorm and a tied or untied head.
Everything a spec can say is checked against that: each resolved component (every param filled
in) must equal what a llama component with the same free sizes resolves to, so a setting this
module never heard of (a window, a softcap, a bias, a qk-norm) is refused rather than dropped.
The refusal names the first part that differs, as ``model.block.mixer.window`` or
``model.layers[2].ffn.activation``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer.model.attention import head_sizes
from specformer.registry.discovery import get_registry
from specformer.spec import BLOCK_FIELDS

#: What each block field must be, and the params that may take any value there (sizes, eps, speed settings).
_FREE = {
    "layout": ("prenorm", ()),
    "norm": ("rmsnorm", ("eps",)),
    "mixer": ("attention", ("n_heads", "n_kv_heads", "head_dim", "dropout", "backend")),
    "ffn": ("swiglu", ("hidden", "dropout")),
}

#: Model fields that must keep these values (llama.cpp's llama has no slot for anything else).
_MODEL_FIXED = {"shared_blocks": {}, "embedding_norm": None, "per_layer_input": None, "lm_head_bias": False,
                "embedding_multiplier": 1.0, "logit_softcap": None, "logit_scale": 1.0, "mtp": None}


class NoGgufMapping(UserError):
    """A spec with a part llama.cpp's llama architecture has no counterpart for; ``part`` is its spec path."""

    def __init__(self, part: str, why: str) -> None:
        self.part = part
        super().__init__(f"{part}: {why}; llama.cpp's llama architecture (the one GGUF export writes so far: "
                         f"prenorm RMSNorm, attention with rope and GQA, SwiGLU) has no equivalent, so it is not exported")


@dataclass(frozen=True)
class LlamaLayout:
    """The hyperparameters of a spec that maps onto llama.cpp's llama architecture."""

    n_layers: int
    d_model: int
    context_length: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_hidden: int | None  # None: the default; the writer reads it from the weights
    norm_eps: float
    rope_theta: float
    #: True: rope pairs adjacent channels (llama.cpp's own layout, weights kept as they are); False: halves (HF's
    #: layout, q and k rows permuted on export, see writer.py).
    rope_interleaved: bool
    #: Llama 3.1's scaling as llama.cpp reads it (the rope_freqs tensor); None: plain rope.
    rope_freq_factors: tuple[float, ...] | None
    tied: bool


def _first_difference(actual: dict[str, Any], expected: dict[str, Any]) -> str | None:
    for key in actual:
        if actual[key] != expected.get(key):
            return key
    return None


def _check(kind: str, actual: dict[str, Any], where: str, registry: Any) -> None:
    """NoGgufMapping unless ``actual`` (a resolved component) is llama's ``kind`` with only free params set."""
    wanted, free = _FREE[kind] if kind in _FREE else (None, ())
    if actual["kind"] != wanted:
        raise NoGgufMapping(where, f"{kind} {actual['kind']!r} (llama.cpp's llama needs {wanted!r})")
    expected = registry.resolve(kind, {"kind": wanted, **{k: actual[k] for k in free if k in actual}}).to_dict()
    field = _first_difference(actual, expected)
    if field is not None:
        raise NoGgufMapping(f"{where}.{field}", f"{actual[field]!r} (llama.cpp's llama reads only {expected[field]!r})")


def llama_layout(spec: Any, registry: Any = None) -> LlamaLayout:
    """The :class:`LlamaLayout` of ``spec``; :class:`NoGgufMapping` naming the first part llama.cpp lacks."""
    registry = registry if registry is not None else get_registry()
    m = spec.model
    for field, value in _MODEL_FIXED.items():
        if getattr(m, field) != value:
            raise NoGgufMapping(f"model.{field}", f"{getattr(m, field)!r}")
    rope = registry.resolve("positional", m.positional.as_dict()).to_dict()
    if rope["kind"] != "rope":
        raise NoGgufMapping("model.positional", f"positional {rope['kind']!r} (llama.cpp's llama needs 'rope')")
    if rope["fraction"] != 1.0:
        raise NoGgufMapping("model.positional.fraction", f"{rope['fraction']} (llama.cpp's llama rotates every channel)")
    if rope["scaling"] is not None and rope["scaling"].get("kind") != "llama3":
        raise NoGgufMapping("model.positional.scaling", f"{rope['scaling'].get('kind')!r} (only llama3's is exported yet)")
    blocks = m.layer_blocks()
    resolved = []
    for i, block in enumerate(blocks):
        where = "model.block" if not m.layers else f"model.layers[{i}]"
        if "positional" in block and registry.resolve("positional", block["positional"]).to_dict() != rope:
            raise NoGgufMapping(f"{where}.positional", "a positional scheme of the layer's own")
        layer = {f: registry.resolve(f, block[f]).to_dict() for f in BLOCK_FIELDS}
        for f in BLOCK_FIELDS:
            _check(f, layer[f], f"{where}.{f}", registry)
        if resolved and layer != resolved[0]:
            field = next(f for f in BLOCK_FIELDS if layer[f] != resolved[0][f])
            raise NoGgufMapping(f"{where}.{field}", "differs from layer 0's (llama.cpp's llama has one shape for all layers)")
        resolved.append(layer)
    residual = registry.resolve("residual", m.block.residual.as_dict()).to_dict()
    if residual != registry.resolve("residual", {"kind": "single"}).to_dict():
        raise NoGgufMapping("model.block.residual", f"residual {residual['kind']!r} (llama.cpp's llama has one stream)")
    final = registry.resolve("norm", m.final_norm_ref()).to_dict()
    _check("norm", final, "model.final_norm", registry)
    layer = resolved[0]
    mixer = layer["mixer"]
    if mixer["v_head_dim"] is not None:  # checked above too (not free); said here for the reason
        raise NoGgufMapping("model.block.mixer.v_head_dim", "values wider or narrower than keys")
    sizes = head_sizes(d_model=m.d_model, n_heads=mixer["n_heads"], n_kv_heads=mixer["n_kv_heads"],
                       head_dim=mixer["head_dim"])
    factors = None
    if rope["scaling"] is not None:
        factors = _llama3_factors(registry.resolve("positional", m.positional.as_dict()), head_dim=sizes.head_dim,
                                  context_length=m.context_length)
    if final["eps"] != layer["norm"]["eps"]:
        raise NoGgufMapping("model.final_norm.eps", f"{final['eps']} (llama.cpp's llama has one eps, the blocks' "
                            f"{layer['norm']['eps']})")
    return LlamaLayout(n_layers=m.n_layers, d_model=m.d_model, context_length=m.context_length,
                       n_heads=sizes.n_heads, n_kv_heads=sizes.n_kv_heads, head_dim=sizes.head_dim,
                       ffn_hidden=layer["ffn"]["hidden"], norm_eps=layer["norm"]["eps"], rope_theta=rope["theta"],
                       rope_interleaved=rope["interleaved"], rope_freq_factors=factors, tied=m.tie_embeddings)


def _llama3_factors(positional: Any, *, head_dim: int, context_length: int) -> tuple[float, ...]:
    """llama.cpp's ``rope_freqs``: what each pair's frequency is divided by, ``theta^(-2j/head_dim) / ours_j``.

    llama.cpp reads Llama 3.1's scaling as this tensor (its converter computes it from the config); here it comes
    from the scaling component's own frequencies, so the file turns each pair exactly as our rope does.
    """
    rope = positional.make(head_dim=head_dim, context_length=context_length)  # our rope module, as the model builds it
    if rope.attention_scaling != 1.0 or rope.scaling.length_dependent:
        raise NoGgufMapping("model.positional.scaling", "a scaling that changes with length or scales attention")
    ours = rope.scaling.frequencies(None).double()
    plain = rope.theta ** (-2 * ours.new_tensor(range(head_dim // 2)) / head_dim)  # theta^(-2j/head_dim)
    return tuple(float(f) for f in plain / ours)
