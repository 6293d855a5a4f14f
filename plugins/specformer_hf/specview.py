"""A spec as export sees it: every layer's effective components with all params filled in.

Families write a ``config.json`` from a :class:`SpecView`. Whatever they write is then
read back with the same family and compared with the spec on everything that
changes the maths (:func:`math_view`); a difference means the family cannot express
the spec, and :func:`differences` names the part, so no export silently drops a
setting the family forgot to look at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Collection

from specformer.model.attention import head_sizes
from specformer.errors import UserError
from specformer.messages import join_path
from specformer.spec import BLOCK_FIELDS, Spec
from specformer.registry.discovery import get_registry
from specformer_layers import default_gated_hidden


class NotExpressible(UserError):
    """A part of a spec that a Hugging Face family has no equivalent for."""

    def __init__(self, path: str, message: str, *, parts: list[str] | None = None) -> None:
        self.path = path
        self.message = message
        #: The spec's paths with no counterpart (``path``, else those ``parts`` lists; none: the message says).
        self.parts = parts if parts is not None else ([path] if path else [])
        super().__init__(f"{path}: {message}" if path else message)


class ExportsAs(NotExpressible):
    """Not a shortcoming of the spec: the family reads one layout and exports through another family (``target``, its
    model_type, tried next when named: a multimodal checkpoint's own text family before others that also fit)."""

    def __init__(self, path: str, message: str, *, target: str | None = None) -> None:
        self.target = target
        super().__init__(path, message)


#: Params that change speed or training, never what a forward pass in eval mode computes.
NON_MATH_PARAMS = frozenset({"backend", "dropout", "aux_loss_coef", "bias_update_rate",  # the last two: training only
                             "a_init_range", "dt_init_range", "dt_init_floor"})  # Gated DeltaNet's initialisation
NON_MATH_MODEL_FIELDS = frozenset({"embedding_dropout", "init_std", "pad_vocab_to_multiple", "layers", "block", "final_norm", "positional",
                                   "embedding_norm"})


@dataclass
class SpecView:
    """The resolved model section: ``positional``, ``final_norm``, ``residual`` and ``layers[i][field]`` as full dicts."""

    spec: Spec
    positional: dict[str, Any]
    final_norm: dict[str, Any]
    layers: list[dict[str, dict[str, Any]]]
    residual: dict[str, Any]

    @classmethod
    def of(cls, spec: Spec, registry: Any = None) -> "SpecView":
        registry = registry if registry is not None else get_registry()
        m = spec.model

        def full(kind: str, ref: dict[str, Any]) -> dict[str, Any]:
            return registry.resolve(kind, ref).to_dict()

        layers = []
        for block in m.layer_blocks():
            layer = {f: full("layout" if f == "layout" else f, block[f]) for f in BLOCK_FIELDS}
            if "positional" in block:  # the scheme inside this layer's attention (per-layer positions)
                layer["positional"] = full("positional", block["positional"])
            layers.append(layer)
        return cls(spec=spec, positional=full("positional", m.positional.as_dict()),
                   final_norm=full("norm", m.final_norm_ref()), layers=layers,
                   residual=full("residual", m.block.residual.as_dict()))

    @property
    def model(self) -> Any:
        return self.spec.model

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    # -- questions families ask ------------------------------------------------------------

    def expect(self, part: dict[str, Any], path: str, kinds: Collection[str], *, family: str) -> dict[str, Any]:
        """``part`` if its kind is one of ``kinds``; otherwise the spec has no equivalent in ``family``."""
        if part["kind"] not in kinds:
            raise NotExpressible(
                join_path(path, ["kind"]),
                f"{part['kind']!r} has no equivalent in Hugging Face {family} (which uses {' or '.join(repr(k) for k in kinds)})",
            )
        return part

    def uniform(self, field: str, key: str | None = None, *, family: str) -> Any:
        """The value of ``layers[*][field][key]`` (or the whole component), which must be the same in every layer."""
        values = [layer[field] if key is None else layer[field].get(key) for layer in self.layers]
        first = values[0]
        if any(v != first for v in values[1:]):
            where = f"model.layers[*].{field}" + (f".{key}" if key else "")
            raise NotExpressible(where, f"differs between layers ({_short(values)}); Hugging Face {family} needs one value for all layers")
        return first

    def per_layer(self, field: str, key: str | None = None) -> list[Any]:
        """``layers[*][field][key]`` (or the whole component) of every layer."""
        return [layer.get(field) if key is None else layer[field].get(key) for layer in self.layers]

    def one_positional(self, *, family: str, except_kinds: Collection[str] = ()) -> None:
        """Refuse per-layer positional schemes: ``family`` has one scheme for every layer (layers of ``except_kinds``
        aside, which the family maps itself: SmolLM3's NoPE layers)."""
        for i, scheme in enumerate(self.per_layer("positional")):
            if scheme is not None and scheme != self.positional and scheme["kind"] not in except_kinds:
                raise NotExpressible(f"model.layers[{i}].positional",
                                     f"{scheme['kind']!r} differs from model.positional; Hugging Face {family} "
                                     "has one positional scheme for all layers")

    def block_kind(self, field: str, kinds: Collection[str], *, family: str) -> str:
        kind = self.uniform(field, "kind", family=family)
        if kind not in kinds:
            raise NotExpressible(
                f"model.block.{field}.kind",
                f"{kind!r} has no equivalent in Hugging Face {family} (which uses {' or '.join(repr(k) for k in kinds)})",
            )
        return kind

    def multi_head(self, *, family: str) -> int:
        """The head count of a model with one key/value head per query head, each d_model / n_heads wide (GPT-2's
        attention, and every family before grouped queries); NotExpressible naming the field otherwise."""
        n_heads, n_kv, head_dim = self.attention_sizes()
        if n_kv != n_heads:
            raise NotExpressible("model.block.mixer.n_kv_heads", f"{n_kv}: Hugging Face {family} has one key/value "
                                 f"head per query head ({n_heads})")
        if head_dim * n_heads != self.model.d_model:
            raise NotExpressible("model.block.mixer.head_dim", f"{head_dim}: Hugging Face {family} has head_dim = "
                                 f"d_model / n_heads ({self.model.d_model} / {n_heads})")
        return n_heads

    def attention_sizes(self, layer: int = 0) -> tuple[int, int, int]:
        """(n_heads, n_kv_heads, head_dim) of a layer, defaults resolved."""
        a = self.layers[layer]["mixer"]
        sizes = head_sizes(d_model=self.model.d_model, n_heads=a["n_heads"], n_kv_heads=a.get("n_kv_heads"),
                           head_dim=a.get("head_dim"))
        return sizes.n_heads, sizes.n_kv_heads, sizes.head_dim


# -- comparing on the maths -----------------------------------------------------------------


def math_view(spec: Spec, registry: Any = None) -> dict[str, Any]:
    """Everything in a spec that changes logits, normalised so equal maths compare equal.

    A component's ``kind`` is replaced by its factory: ``{kind: swiglu, activation:
    gelu_tanh}`` and ``{kind: geglu, activation: gelu_tanh}`` build the same module.
    """
    registry = registry if registry is not None else get_registry()
    view = SpecView.of(spec, registry)

    def identity(kind: str, part: dict[str, Any]) -> dict[str, Any]:
        factory = registry.get(kind, part["kind"]).factory
        target = getattr(factory, "__func__", factory)
        name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', repr(target))}"
        return {**_strip(part), "kind": name}

    m = spec.model
    out: dict[str, Any] = {
        name: getattr(m, name) for name in type(m).model_fields if name not in NON_MATH_MODEL_FIELDS
    }
    if m.mtp is not None:
        # The depths' loss weights train them; they change no logit.
        out["mtp"] = m.mtp.model_dump(exclude={"loss_weights"})
    out["embedding_multiplier"] = (
        math.sqrt(m.d_model) if m.embedding_multiplier == "sqrt_d_model" else float(m.embedding_multiplier)
    )
    out["positional"] = _resolved_scaling(identity("positional", view.positional), m.context_length)
    out["final_norm"] = identity("norm", view.final_norm)
    if m.embedding_norm is not None:
        out["embedding_norm"] = identity("norm", registry.resolve("norm", m.embedding_norm.as_dict()).to_dict())
    out["block"] = {"residual": identity("residual", view.residual)}  # one stream or several: the maths of every block
    if m.per_layer_input is not None:
        part = identity("per_layer_input", registry.resolve("per_layer_input", m.per_layer_input.as_dict()).to_dict())
        if "vocab_size" in part and part["vocab_size"] is None:  # the built-in's default written out
            part["vocab_size"] = m.vocab_size
        out["per_layer_input"] = part
    layers = []
    for i, layer in enumerate(view.layers):
        resolved = {**layer, "ffn": _resolved_ffn(layer["ffn"], m.d_model)}
        fields = {f: identity("layout" if f == "layout" else f, resolved[f]) for f in BLOCK_FIELDS}
        if "positional" in layer:
            fields["positional"] = _resolved_scaling(identity("positional", layer["positional"]), m.context_length)
        _attention_defaults_written_out(fields["mixer"], m.d_model)
        layers.append(fields)
    out["layers"] = layers
    return out


def _attention_defaults_written_out(attention: dict[str, Any], d_model: int) -> None:
    """The built-in attention's derived defaults (kv heads, head_dim, scale) written out, in place; also in the
    sub-mixers of a ``parallel`` mixer; and the Gated DeltaNet's size defaults (key heads, key and value widths)."""
    kind = str(attention.get("kind", ""))
    if kind == "gated_deltanet" or kind.endswith(".GatedDeltaNet"):
        key_dim = attention.get("key_head_dim") or d_model // attention["n_heads"]
        attention.update(n_key_heads=attention.get("n_key_heads") or attention["n_heads"], key_head_dim=key_dim,
                         value_head_dim=attention.get("value_head_dim") or key_dim)
    elif "n_heads" in attention and not (kind == "mla" or kind.endswith(".LatentAttention")):
        # Latent attention has no head_dim: its widths are its own fields, and n_heads need not divide d_model
        # (GLM-4.7-Flash: 20 heads over 2048).
        sizes = head_sizes(d_model=d_model, n_heads=attention["n_heads"], n_kv_heads=attention.get("n_kv_heads"),
                           head_dim=attention.get("head_dim"))
        attention["n_kv_heads"], attention["head_dim"] = sizes.n_kv_heads, sizes.head_dim
        if attention.get("scale") is None:
            attention["scale"] = 1.0 / math.sqrt(sizes.head_dim)
    for mixer in attention.get("mixers") or []:
        if isinstance(mixer, dict):
            _attention_defaults_written_out(mixer, d_model)


def _resolved_ffn(ffn: dict[str, Any], d_model: int) -> dict[str, Any]:
    """The built-in feed-forwards' ``hidden: null``, written out as the width they build."""
    if ffn.get("hidden") is not None or ffn["kind"] not in ("swiglu", "geglu", "reglu", "mlp", "moe"):
        return ffn
    gated = ffn["kind"] != "mlp" and ffn.get("gated", True)
    return {**ffn, "hidden": default_gated_hidden(d_model) if gated else 4 * d_model}


def _resolved_scaling(positional: dict[str, Any], context_length: int) -> dict[str, Any]:
    """RoPE scaling params whose None means a value computed from the context length, written out."""
    scaling = positional.get("scaling")
    if not isinstance(scaling, dict):
        return positional
    scaling = dict(scaling)
    if scaling.get("kind") == "dynamic" and scaling.get("original_context_length") is None:
        scaling["original_context_length"] = context_length
    if scaling.get("kind") in ("yarn", "longrope") and scaling.get("factor") is None:
        scaling["factor"] = context_length / scaling["original_context_length"]
    return {**positional, "scaling": scaling}


def _strip(component: Any) -> Any:
    if isinstance(component, dict):
        return {k: _strip(v) for k, v in component.items() if k not in NON_MATH_PARAMS}
    if isinstance(component, list):
        return [_strip(v) for v in component]
    return component


def differences(ours: Any, theirs: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every (path, ours, theirs) where two math views differ."""
    if isinstance(ours, dict) and isinstance(theirs, dict) and ours.get("kind") == theirs.get("kind"):
        out = []
        for key in sorted(set(ours) | set(theirs), key=str):
            out += differences(ours.get(key), theirs.get(key), join_path(path, [str(key)]))
        return out
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        out = []
        for i, (a, b) in enumerate(zip(ours, theirs)):
            out += differences(a, b, join_path(path, [i]))
        return out
    if _same(ours, theirs):
        return []
    return [(path, ours, theirs)]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) and not isinstance(b, bool):
            return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    return a == b


def describe_differences(diffs: list[tuple[str, Any, Any]], n_layers: int) -> list[tuple[str, str]]:
    """``(human path, line)`` per difference: one found in every layer is reported once, at ``model.block``."""
    by_rest: dict[str, list[tuple[int, Any, Any]]] = {}
    lines = []
    for path, ours, theirs in diffs:
        if path.startswith("layers["):
            index, rest = path[len("layers["):].split("]", 1)
            by_rest.setdefault(rest.lstrip("."), []).append((int(index), ours, theirs))
        else:
            lines.append((f"model.{path}", f"model.{path}: {ours!r} (the family gives {theirs!r})"))
    for rest, hits in by_rest.items():
        if len(hits) == n_layers and len({repr((o, t)) for _, o, t in hits}) == 1:
            _, ours, theirs = hits[0]
            lines.append((f"model.block.{rest}", f"model.block.{rest}: {ours!r} (the family gives {theirs!r})"))
        else:
            for index, ours, theirs in hits:
                lines.append((f"model.layers[{index}].{rest}",
                              f"model.layers (layer {index}) {rest}: {ours!r} (the family gives {theirs!r})"))
    return lines


def _short(values: list[Any]) -> str:
    text = ", ".join(repr(v) for v in values[:8])
    return text + (", ..." if len(values) > 8 else "")


__all__ = ["ExportsAs", "NotExpressible", "SpecView", "describe_differences", "differences", "math_view"]
