"""The spec: what a person writes down to describe a model (and, through plugins, its training).

Validation happens in three passes so that every problem is reported at once, each
with the dotted path of the offending field:

1. structure: the shape of the file (pydantic models below);
2. registry: every ``kind`` names a registered component and its params fit that
   component's own ``Params`` model; each top-level section (``train``, ``generate``)
   fits the model its plugin registered;
3. sizes: the builder constructs the model on the ``meta`` device (no memory) so that
   constraints between sizes (``n_heads`` must divide ``d_model``) are checked by the
   components themselves, and plugins' ``specformer_validate_spec`` hooks run.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specformer.errors import Problem, SpecError
from specformer.messages import join_path, parse_error_message, unknown_message  # one path format: generate.sampler[1].k
from specformer.params import as_component_ref

# -- pieces of a spec ---------------------------------------------------------------


class ComponentRef(BaseModel):
    """A component named in a spec: ``{kind: <registered name>, <its params>...}`` or just the name."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="The registered name of the component.")

    @model_validator(mode="before")
    @classmethod
    def _accept_bare_name(cls, value: Any) -> Any:
        return as_component_ref(value)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **(self.model_extra or {})}


class BlockSpec(BaseModel):
    """One transformer block: how it is wired (layout) and its parts."""

    model_config = ConfigDict(extra="forbid")

    layout: ComponentRef = Field(
        default_factory=lambda: ComponentRef(kind="prenorm"),
        description="How norms, attention and feed-forward are wired around the residual stream.",
    )
    norm: ComponentRef = Field(description="The norm the layout places around sublayers.")
    attention: ComponentRef = Field(description="The self-attention sublayer.")
    ffn: ComponentRef = Field(description="The feed-forward sublayer.")


BLOCK_FIELDS = ("layout", "norm", "attention", "ffn")


class LayerOverride(BaseModel):
    """Changes to the block for some layers: any block field, merged into the base block's.

    A component given with the same ``kind`` as the base block's has its params merged
    (``attention: {window: 4096}`` keeps every other attention param); a different
    ``kind`` replaces the component whole.
    """

    model_config = ConfigDict(extra="forbid")

    select: Union[int, list[int], str] = Field(
        description=(
            "Which layers: an index (negative counts from the end), a list of indices, "
            "a Python slice such as '0::2' or '-4:', or 'all'."
        )
    )
    layout: dict[str, Any] | str | None = Field(default=None, description="Changes to the layout of the selected layers (merged; a new kind replaces).")
    norm: dict[str, Any] | str | None = Field(default=None, description="Changes to the norm of the selected layers (merged; a new kind replaces).")
    attention: dict[str, Any] | str | None = Field(default=None, description="Changes to the attention of the selected layers (merged; a new kind replaces).")
    ffn: dict[str, Any] | str | None = Field(default=None, description="Changes to the feed-forward of the selected layers (merged; a new kind replaces).")

    def layer_indices(self, n_layers: int) -> list[int]:
        """The layers this override selects; ValueError naming the bad selection."""
        return select_layers(self.select, n_layers)


class ModelSpec(BaseModel):
    """The architecture: sizes, positional scheme, block and per-layer changes, head."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(gt=0, description="Number of token ids the model reads and predicts.")
    d_model: int = Field(gt=0, description="Width of the residual stream.")
    n_layers: int = Field(gt=0, description="Number of blocks.")
    context_length: int = Field(gt=0, description="Longest sequence the model is built for.")
    positional: ComponentRef = Field(description="How positions enter the model.")
    block: BlockSpec
    layers: list[LayerOverride] = Field(
        default_factory=list, description="Per-layer overrides of block fields, applied in order."
    )
    final_norm: ComponentRef | None = Field(
        default=None, description="Norm before the LM head; defaults to the block's norm."
    )
    tie_embeddings: bool = Field(default=True, description="Share the token embedding with the LM head.")
    lm_head_bias: bool = Field(default=False, description="Give the LM head a bias (needs untied embeddings).")
    embedding_multiplier: float | Literal["sqrt_d_model"] = Field(
        default=1.0, description="Scale token embeddings by this (Gemma uses sqrt_d_model)."
    )
    logit_softcap: float | None = Field(
        default=None, gt=0, description="Cap final logits smoothly: cap * tanh(logits / cap) (Gemma 2)."
    )
    pad_vocab_to_multiple: int = Field(
        default=1, gt=0, description="Pad embedding rows to a multiple of this for faster matmuls; logits keep vocab_size."
    )
    embedding_dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the input embeddings.")
    init_std: float = Field(default=0.02, gt=0, description="Std of the normal init of weights; output projections are scaled by 1/sqrt(2*n_layers).")

    @model_validator(mode="after")
    def _head_bias_needs_untied(self) -> "ModelSpec":
        if self.lm_head_bias and self.tie_embeddings:
            raise ValueError("lm_head_bias: true needs tie_embeddings: false (a tied head has no separate bias)")
        return self

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_to_multiple
        return (self.vocab_size + m - 1) // m * m

    def layer_blocks(self) -> list[dict[str, dict[str, Any]]]:
        """The effective block of every layer: base block with the overrides that select it applied."""
        base = {f: getattr(self.block, f).as_dict() for f in BLOCK_FIELDS}
        blocks = [{f: dict(v) for f, v in base.items()} for _ in range(self.n_layers)]
        for override in self.layers:
            for index in override.layer_indices(self.n_layers):
                for f in BLOCK_FIELDS:
                    change = getattr(override, f)
                    if change is None:
                        continue
                    change = as_component_ref(change) if isinstance(change, str) else dict(change)
                    current = blocks[index][f]
                    if "kind" in change and change["kind"] != current["kind"]:
                        blocks[index][f] = change
                    else:
                        blocks[index][f] = {**current, **change}
        return blocks

    def final_norm_ref(self) -> dict[str, Any]:
        return (self.final_norm or self.block.norm).as_dict()


class Spec(BaseModel):
    """A whole spec file: ``model`` plus any sections plugins registered (``train``, ``generate``)."""

    model_config = ConfigDict(extra="allow")

    model: ModelSpec

    def section(self, name: str, default: Any = None) -> Any:
        """A plugin's section, validated by the model it registered, or ``default``."""
        return (self.model_extra or {}).get(name, default)

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=False)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


# -- layer selection -----------------------------------------------------------------


def select_layers(select: int | list[int] | str, n_layers: int) -> list[int]:
    def one(i: int) -> int:
        j = i + n_layers if i < 0 else i
        if not 0 <= j < n_layers:
            raise ValueError(f"layer {i} does not exist (the model has {n_layers} layers: 0..{n_layers - 1})")
        return j

    if isinstance(select, bool):
        raise ValueError(f"select must be an index, a list, a slice or 'all', got {select!r}")
    if isinstance(select, int):
        return [one(select)]
    if isinstance(select, list):
        return sorted({one(i) for i in select})
    text = select.strip()
    if text == "all":
        return list(range(n_layers))
    parts = text.split(":")
    try:
        if len(parts) == 1:
            return [one(int(text))]
        if len(parts) > 3:
            raise ValueError
        bounds = [int(p) if p.strip() else None for p in parts]
    except ValueError:
        raise ValueError(
            f"select {select!r} is not an index, a list, a slice such as '0::2' or '-4:', or 'all'"
        ) from None
    if len(bounds) == 3 and bounds[2] == 0:
        raise ValueError(f"select {select!r}: a slice step cannot be zero")
    chosen = list(range(n_layers))[slice(*bounds)]
    if not chosen:
        raise ValueError(f"select {select!r} selects no layer of {n_layers}")
    return chosen


# -- loading -------------------------------------------------------------------------

SPEC_SUFFIXES = {".yaml": "YAML", ".yml": "YAML", ".json": "JSON", ".toml": "TOML"}


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """Parse a spec file into plain data; a missing or malformed file is a :class:`SpecError`."""
    path = Path(path)
    where = str(path)
    fmt = SPEC_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise SpecError(
            [Problem("", f"unsupported spec file type {path.suffix!r}; accepted: .yaml, .yml, .json, .toml")],
            source=where,
        )
    if not path.is_file():
        raise SpecError([Problem("", "no such file")], source=where)
    text = path.read_text(encoding="utf-8")
    try:
        if fmt == "YAML":
            data = yaml.safe_load(text)
        elif fmt == "JSON":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except (yaml.YAMLError, json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise SpecError([Problem("", parse_error_message(exc, fmt))], source=where) from None
    if not isinstance(data, dict):
        raise SpecError([Problem("", f"a spec must be a mapping with a 'model' section, got {type(data).__name__}")], source=where)
    return data


def load_spec(source: "str | Path | dict[str, Any] | Spec", *, registry: Any = None, check_sizes: bool = True) -> Spec:
    """Read and fully validate a spec from a file path, a dict, or an existing :class:`Spec`.

    Raises :class:`~specformer.errors.SpecError` listing every problem with its path.
    """
    from specformer.plugins import get_registry
    from specformer.validate import validate_spec

    registry = registry or get_registry()
    where: str | None = None
    if isinstance(source, Spec):
        data = source.to_dict()
    elif isinstance(source, dict):
        data = source
    else:
        where = str(source)
        data = read_spec_file(source)
    return validate_spec(data, registry=registry, source=where, check_sizes=check_sizes)


def problems_from_validation_error(exc: ValidationError, *, prefix: str = "", model: type[BaseModel] | None = None) -> list[Problem]:
    """Turn pydantic's errors into one :class:`Problem` per error, with full dotted paths."""
    problems = []
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not (isinstance(p, str) and p in _UNION_TAGS)]
        nested = (err.get("ctx") or {}).get("problems") if err["type"] == "invalid_component" else None
        if nested:  # a sub-component's own problems, each at its full path (see params.SubComponent)
            problems += [Problem(join_path(prefix, [*loc, sub_path]), sub_message) for sub_path, sub_message in nested]
            continue
        if err["type"] == "unknown_component":
            loc = [*loc, "kind"]  # where the name is written, as for the model's own components
        path = join_path(prefix, loc)
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            accepted = _accepted_fields(model, loc[:-1])
            message = unknown_message("field", loc[-1], accepted, quote_name=False) if accepted else "unknown field"
        elif err["type"] == "missing":
            message = "required field is missing"
        elif "input" in err and err["type"] not in ("unknown_component", "invalid_component"):
            message += f" (got {err['input']!r})"
        problems.append(Problem(path, message))
    return problems


_UNION_TAGS = {"int", "list[int]", "str", "dict[str,any]", "float", "function-plain[validate()]", "constrained-float"}


def _accepted_fields(model: type[BaseModel] | None, loc: list[Any]) -> list[str]:
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)) or part not in current.model_fields:
            return []
        annotation = current.model_fields[part].annotation
        current = _first_model(annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _first_model(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _first_model(arg)
        if found is not None:
            return found
    return None


__all__ = [
    "BlockSpec",
    "ComponentRef",
    "LayerOverride",
    "ModelSpec",
    "Spec",
    "load_spec",
    "problems_from_validation_error",
    "read_spec_file",
    "select_layers",
]
