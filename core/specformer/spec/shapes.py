"""The shapes of a spec: what a person writes down to describe a model, as plain pydantic models.

This module holds the *shapes* of a spec only: plain pydantic models that check the
structure of a file (which fields exist, their types and bounds), the reading of a
file into plain data, and the turning of pydantic's errors into problems at
dotted paths. It knows no registry and no component. The core's path for a spec goes
upward from here, one layer importing only the ones below it:

1. shapes (this module): the structure of the file;
2. validation (:mod:`specformer.spec.validate`): every ``kind`` resolved against the
   registry once, each section checked by the model its plugin registered;
3. sizes (:mod:`specformer.spec.size_check`): constraints between sizes (``n_heads`` must
   divide ``d_model``), each declared by its component and asked without building, then
   the plugins' ``specformer_validate_spec`` hooks;
4. building (:mod:`specformer.model.builder`): modules from what validation resolved.

:mod:`specformer.spec` is where plugins and users take the spec from: these shapes and
:func:`~specformer.spec.load_spec`, which takes a spec through every step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specformer.files.datafile import FORMATS, read_data_file
from specformer.errors import InputError, Problem, SpecError, excerpt
from specformer.spec.layer_groups import membership, overrides_of_layer
from specformer.messages import closest, join_path, unknown_message  # the one path format: generate.sampler[1].k
from specformer.spec.strict import StrictNumbers

# -- pieces of a spec ---------------------------------------------------------------


def as_component_ref(value: Any) -> dict[str, Any]:
    """A spec may name a component by a bare string: ``norm: rmsnorm`` is ``{kind: rmsnorm}``."""
    if isinstance(value, str):
        return {"kind": value}
    if isinstance(value, dict):
        if "kind" not in value:
            raise ValueError("a component needs a 'kind' naming the registered component")
        if not isinstance(value["kind"], str):
            raise ValueError(f"'kind' must be a string naming a component, got {excerpt(value['kind'])}")
        return dict(value)
    raise ValueError(f"expected a component as a name or a mapping with 'kind', got {excerpt(value)}")


def apply_change(current: dict[str, Any], change: "dict[str, Any] | str") -> tuple[dict[str, Any], bool]:
    """A component with a layer override's change applied, and whether the change replaced it whole.

    A change naming another ``kind`` replaces the component (with that kind's own defaults);
    one with the same kind, or none, is merged into it param by param.
    """
    change = as_component_ref(change) if isinstance(change, str) else dict(change)
    if "kind" in change and change["kind"] != current.get("kind"):
        return change, True
    return {**current, **change}, False


class ComponentRef(StrictNumbers):
    """A component named in a spec: ``{kind: <registered name>, <its params>...}`` or just the name."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="The registered name of the component.")

    @model_validator(mode="before")
    @classmethod
    def _accept_bare_name(cls, value: Any) -> Any:
        return as_component_ref(value)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, **(self.model_extra or {})}


class BlockSpec(StrictNumbers):
    """One transformer block: how it is wired (layout) and its parts."""

    model_config = ConfigDict(extra="forbid")

    layout: ComponentRef = Field(
        default_factory=lambda: ComponentRef(kind="prenorm"),
        description="How norms, the token mixer and feed-forward are wired around the residual stream.",
    )
    norm: ComponentRef = Field(description="The norm the layout places around sublayers.")
    mixer: ComponentRef = Field(description=("The token mixer: the sublayer that reads other tokens (attention, a "
                                             "recurrence such as mamba2, a convolution, or none)."))
    ffn: ComponentRef = Field(description="The feed-forward sublayer.")
    positional: ComponentRef | None = Field(
        default=None,
        description=("The positional scheme inside this block's mixer (rope, alibi, none); default model.positional. "
                     "Schemes that add to the embeddings (learned, sinusoidal) are model-level only."),
    )
    residual: ComponentRef = Field(
        default_factory=lambda: ComponentRef(kind="single"),
        description=("The residual stream every block reads and writes (single; or several streams, mhc). "
                     "One for the whole model: a layer override cannot change it."),
    )


class AdapterTarget(StrictNumbers):
    """The widths of one linear map a per-use adapter adds to: what it reads, and its output rows, split into pieces."""

    model_config = ConfigDict(extra="forbid")

    inputs: int = Field(gt=0, description="The linear map's input width (in_features).")
    outputs: list[int] = Field(
        min_length=1,
        description=("Its output rows, in pieces that sum to out_features: each piece gets a low-rank pair of its "
                     "own (a fused query/key/value projection: [q rows, k rows, v rows]); one piece: one pair."),
    )

    @field_validator("outputs")
    @classmethod
    def _positive(cls, outputs: list[int]) -> list[int]:
        if any(o <= 0 for o in outputs):
            raise ValueError(f"every piece of outputs must be a positive row count, got {outputs}")
        return outputs


class SharedAdapters(StrictNumbers):
    """Low-rank adapters each use of a shared block has of its own (Zamba2's per-use LoRA on q/k/v and gate_up).

    At a use, a target linear map's output piece ``y_p`` becomes ``y_p + B_p (A_p x)`` with that use's
    ``A_p`` (rank x inputs) and ``B_p`` (piece rows x rank), no biases.
    """

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(gt=0, description="The rank of every adapter pair.")
    targets: dict[str, AdapterTarget] = Field(
        min_length=1,
        description=("The shared block's linear maps to adapt, by module path inside the block (mixer.qkv, "
                     "ffn.gate_up), with their widths (checked against the built module)."),
    )


class SharedBlockSpec(StrictNumbers):
    """A block whose weights several layers use (``model.shared_blocks``): built once, run wherever a layer names it.

    It reads the model's positional scheme and residual stream; each use keeps its own cache. ``output``,
    ``projection`` and ``adapters`` say what each use adds around the shared weights (Zamba's hybrid layer).
    """

    model_config = ConfigDict(extra="forbid")

    layout: ComponentRef = Field(default_factory=lambda: ComponentRef(kind="prenorm"),
                                 description="How norms, the token mixer and feed-forward are wired (as model.block.layout).")
    norm: ComponentRef = Field(description="The norm the layout places around sublayers.")
    mixer: ComponentRef = Field(description="The token mixer (attention, a recurrence, or none).")
    ffn: ComponentRef = Field(description="The feed-forward sublayer.")
    input: Literal["stream", "concat_embeddings"] = Field(
        default="stream",
        description=("What the block reads: stream (the residual stream), or concat_embeddings (the stream and the "
                     "embeddings the first block read, concatenated: 2 x d_model wide, normed by the block's norm kind "
                     "at that width, input_norm; the layout must be prenorm with mixer_pre_norm: false and "
                     "residual_scales [0, ...], and the mixer read 2 x d_model: Zamba's shared transformer)."),
    )
    output: Literal["stream", "mixer_input"] = Field(
        default="stream",
        description=("Where the block's output goes: stream (it is the residual stream the layer's own block reads), "
                     "or mixer_input (the stream passes it by; it is added to the layer's own block's mixer input, "
                     "before that block's norm, and not to its residual: Zamba's shared transformer)."),
    )
    projection: bool = Field(
        default=False,
        description=("Each use multiplies the block's output by a d_model x d_model matrix of its own (no bias) "
                     "before it is added; needs output: mixer_input."),
    )
    adapters: SharedAdapters | None = Field(
        default=None, description="Low-rank adapters of each use's own on named linear maps of the block.")

    @model_validator(mode="after")
    def _projection_needs_mixer_input(self) -> "SharedBlockSpec":
        if self.input == "concat_embeddings" and self.output != "mixer_input":
            raise ValueError("input concat_embeddings needs output: mixer_input (a 2 x d_model input leaves no residual "
                             "stream for the block to write)")
        if self.projection and self.output != "mixer_input":
            raise ValueError("projection needs output: mixer_input (a projected output is added to the next "
                             "block's mixer input, not written over the residual stream)")
        return self


BLOCK_FIELDS = ("layout", "norm", "mixer", "ffn")
#: Block fields a layer override may change: the components, and the positional scheme inside the mixer.
OVERRIDE_FIELDS = (*BLOCK_FIELDS, "positional")


class LayerOverride(StrictNumbers):
    """Changes to the block for some layers: any block field, merged into the base block's.

    A component given with the same ``kind`` as the base block's has its params merged
    (``mixer: {window: 4096}`` keeps every other param of the mixer); a different
    ``kind`` replaces the component whole.
    """

    model_config = ConfigDict(extra="forbid")

    select: Union[int, list[int], str] = Field(
        description=(
            "Which layers: an index (negative counts from the end; quoted, '5' is the same index), "
            "a list of indices, a Python slice such as '0::2' or '-4:', or 'all'."
        )
    )
    layout: dict[str, Any] | str | None = Field(default=None, description="Changes to the layout of the selected layers (merged; a new kind replaces).")
    norm: dict[str, Any] | str | None = Field(default=None, description="Changes to the norm of the selected layers (merged; a new kind replaces).")
    mixer: dict[str, Any] | str | None = Field(default=None, description="Changes to the token mixer of the selected layers (merged; a new kind replaces).")
    ffn: dict[str, Any] | str | None = Field(default=None, description="Changes to the feed-forward of the selected layers (merged; a new kind replaces).")
    positional: dict[str, Any] | str | None = Field(
        default=None,
        description="Changes to the positional scheme inside the selected layers' mixer (merged; a new kind replaces).",
    )
    shared: str | None = Field(
        default=None,
        description=("The name of a model.shared_blocks entry to run before the selected layers' own block: the same "
                     "weights at every use, a cache of its own per use. A later override naming another replaces it."),
    )

    def layer_indices(self, n_layers: int) -> list[int]:
        """The layers this override selects; ValueError naming the bad selection."""
        return select_layers(self.select, n_layers)

    def layer_selection(self, n_layers: int) -> "range | list[int]":
        """Like :meth:`layer_indices`, but a slice stays a ``range``."""
        return layer_selection(self.select, n_layers)


class MTPBlockChange(StrictNumbers):
    """Changes to the model's block for the block every MTP depth runs (merged as a layer override's are)."""

    model_config = ConfigDict(extra="forbid")

    layout: dict[str, Any] | str | None = Field(default=None, description="Changes to the layout (merged; a new kind replaces).")
    norm: dict[str, Any] | str | None = Field(default=None, description="Changes to the block's norm (merged; a new kind replaces).")
    mixer: dict[str, Any] | str | None = Field(default=None, description="Changes to the token mixer (merged; a new kind replaces).")
    ffn: dict[str, Any] | str | None = Field(default=None, description="Changes to the feed-forward (merged; a new kind replaces).")
    positional: dict[str, Any] | str | None = Field(
        default=None,
        description="The positional scheme inside the depth's mixer, as a layer override's (merged into the model's; "
                    "a new kind replaces); default the model's scheme.",
    )


#: Block fields an MTP depth's block may change (``positional`` too, resolved as a layer override's).
MTP_BLOCK_FIELDS = ("layout", "norm", "mixer", "ffn")


class MTPSpec(StrictNumbers):
    """Multi-token prediction (DeepSeek-V3, arXiv:2412.19437 section 2.2): ``depths`` extra modules, depth k
    predicting the token k + 1 positions ahead from depth k-1's hidden state and the embedding of the token
    k positions ahead (normed each, concatenated, projected to d_model, one block, a final norm, the shared head)."""

    model_config = ConfigDict(extra="forbid")

    depths: int = Field(gt=0, le=64, description="Number of prediction depths, 1 to 64 (DeepSeek-V3: 1; each is a block).")
    block: MTPBlockChange = Field(
        default_factory=MTPBlockChange,
        description="Changes to model.block for the block each depth runs; by default each runs the model's block.")
    input_norm: ComponentRef | None = Field(
        default=None, description="The norm of the hidden state and of the embedding (enorm, hnorm); default the block's norm.")
    final_norm: ComponentRef | None = Field(
        default=None, description="The norm before the shared LM head (shared_head.norm); default model.final_norm.")
    loss_weights: list[float] | None = Field(
        default=None,
        description="Weight of each depth's cross-entropy in the training loss, one per depth; default 0.3 / depths each "
                    "(DeepSeek-V3's lambda = 0.3, averaged over the depths).")

    @model_validator(mode="after")
    def _one_weight_per_depth(self) -> "MTPSpec":
        if self.loss_weights is not None:
            if len(self.loss_weights) != self.depths:
                raise ValueError(f"loss_weights gives {len(self.loss_weights)} weights for {self.depths} depths; "
                                 f"give one weight per depth (or leave it out for 0.3 / depths each)")
            bad = [w for w in self.loss_weights if not w >= 0]
            if bad:
                raise ValueError(f"loss_weights must be numbers >= 0, got {excerpt(bad[0])}")
        return self

    def weights(self) -> list[float]:
        """The loss weight of each depth, the default filled in."""
        return list(self.loss_weights) if self.loss_weights is not None else [0.3 / self.depths] * self.depths


class ModelSpec(StrictNumbers):
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
    shared_blocks: dict[str, SharedBlockSpec] = Field(
        default_factory=dict,
        description=("Blocks whose weights are stored once and run at every layer whose override names them "
                     "(model.layers[].shared), each use with a cache of its own (Zamba's shared attention)."),
    )
    embedding_norm: ComponentRef | None = Field(
        default=None,
        description="Norm on the token embeddings, before positions are added and the first block "
                    "(BLOOM's word_embeddings_layernorm, nanochat's weightless RMSNorm); none by default.",
    )
    final_norm: ComponentRef | None = Field(
        default=None, description="Norm before the LM head; defaults to the block's norm."
    )
    per_layer_input: ComponentRef | None = Field(
        default=None,
        description="Per-layer inputs computed once per forward from the tokens, each block given its slice "
                    "(Gemma 3n's and Gemma 4's per-layer embeddings); none by default.",
    )
    tie_embeddings: bool = Field(default=True, description="Share the token embedding with the LM head.")
    lm_head_bias: bool = Field(
        default=False, description="Give the LM head a bias; with tied embeddings it is a parameter of its own (CTRL).")
    embedding_multiplier: float | Literal["sqrt_d_model"] = Field(
        default=1.0, description="Scale token embeddings by this (Gemma uses sqrt_d_model)."
    )
    logit_softcap: float | None = Field(
        default=None, gt=0, description="Cap final logits smoothly: cap * tanh(logits / cap) (Gemma 2)."
    )
    logit_scale: float = Field(
        default=1.0, gt=0, description="Multiply the final logits by this, before any soft-cap (Cohere's logit_scale)."
    )
    pad_vocab_to_multiple: int = Field(
        default=1, gt=0, description="Pad embedding rows to a multiple of this for faster matmuls; logits keep vocab_size."
    )
    embedding_dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the input embeddings.")
    init_std: float = Field(default=0.02, gt=0, description="Std of the normal init of weights; output projections are scaled by 1/sqrt(2*n_layers).")
    mtp: MTPSpec | None = Field(
        default=None,
        description="Multi-token prediction depths trained beside the next-token head (DeepSeek-V3); none by default.")

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_to_multiple
        return (self.vocab_size + m - 1) // m * m

    def layer_selections(self) -> list["range | list[int]"]:
        """The layers each override selects (a ``range`` for slices); ValueError for a bad one."""
        return [layer_selection(o.select, self.n_layers) for o in self.layers]

    def block_with(self, overrides: Iterable[int]) -> dict[str, dict[str, Any]]:
        """The base block with the overrides at these indices of ``layers`` applied, in order.

        Its ``positional`` is the scheme inside the mixer: the block's, else ``model.positional``.
        """
        block = {f: getattr(self.block, f).as_dict() for f in BLOCK_FIELDS}
        block["positional"] = (self.block.positional or self.positional).as_dict()
        for j in overrides:
            override = self.layers[j]
            for f in OVERRIDE_FIELDS:
                change = getattr(override, f)
                if change is not None:
                    block[f], _replaced = apply_change(block[f], change)
        return block

    def layer_blocks(self) -> list[dict[str, dict[str, Any]]]:
        """The effective block of every layer: base block with the overrides that select it applied."""
        selections = membership(self.layer_selections())
        blocks: dict[tuple[int, ...], dict[str, dict[str, Any]]] = {}
        out = []
        for i in range(self.n_layers):
            signature = overrides_of_layer(i, selections)
            if signature not in blocks:
                blocks[signature] = self.block_with(signature)
            out.append({f: dict(v) for f, v in blocks[signature].items()})
        return out

    def shared_of(self, overrides: Iterable[int]) -> str | None:
        """The shared block run before a layer selected by ``overrides`` (the last that names one), or None."""
        named = [self.layers[j].shared for j in overrides if self.layers[j].shared is not None]
        return named[-1] if named else None

    def final_norm_ref(self) -> dict[str, Any]:
        return (self.final_norm or self.block.norm).as_dict()


class Spec(StrictNumbers):
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
    """The sorted layer indices ``select`` names; ValueError naming a bad selection."""
    return list(layer_selection(select, n_layers))


def layer_selection(select: int | list[int] | str, n_layers: int) -> "range | list[int]":
    """Like :func:`select_layers`, but a slice stays a ``range`` (no list of a million layers)."""

    def one(i: int) -> int:
        j = i + n_layers if i < 0 else i
        if not 0 <= j < n_layers:
            raise ValueError(f"layer {i} does not exist (the model has {n_layers} layers: 0..{n_layers - 1})")
        return j

    if isinstance(select, bool):
        raise ValueError(f"select must be an index, a list, a slice or 'all', got {excerpt(select)}")
    if isinstance(select, int):
        return [one(select)]
    if isinstance(select, list):
        return sorted({one(i) for i in select})
    text = select.strip()
    if text == "all":
        return range(n_layers)
    parts = text.split(":")
    try:
        if len(parts) > 3:
            raise ValueError
        bounds = [int(p) if p.strip() else None for p in parts]
        if bounds == [None]:  # an empty text: neither an index nor a slice
            raise ValueError
    except ValueError:
        raise ValueError(
            f"select {excerpt(select)} is not an index, a list, a slice such as '0::2' or '-4:', or 'all'"
        ) from None
    if len(bounds) == 1 and bounds[0] is not None:  # a quoted index ("5", as some YAML writers quote every scalar) is that index
        return [one(bounds[0])]
    if len(bounds) == 3 and bounds[2] == 0:
        raise ValueError(f"select {excerpt(select)}: a slice step cannot be zero")
    chosen = range(n_layers)[slice(*bounds)]
    if chosen.step < 0:  # the same layers, in increasing order
        chosen = chosen[::-1]
    if not chosen:
        raise ValueError(f"select {excerpt(select)} selects no layer of {n_layers}")
    return chosen


# -- loading -------------------------------------------------------------------------

SPEC_SUFFIXES = FORMATS


def read_spec_file(path: str | Path) -> dict[str, Any]:
    """Parse a spec file into plain data; a missing, malformed or oversized file is a :class:`SpecError`.

    Reading is bounded (size, nesting, YAML aliases): see :mod:`specformer.files.datafile`.
    """
    path = Path(path)
    where = str(path)
    try:
        data = read_data_file(path, what="spec file")
    except InputError as exc:
        message = str(exc).removeprefix(f"{where}: ")
        raise SpecError([Problem("", message)], source=where) from None
    if not isinstance(data, dict):
        raise SpecError([Problem("", f"a spec must be a mapping with a 'model' section, got {type(data).__name__}")], source=where)
    return data


def problems_from_validation_error(exc: ValidationError, *, prefix: str = "", model: type[BaseModel] | None = None) -> list[Problem]:
    """Turn pydantic's errors into one :class:`Problem` per field, with full dotted paths.

    A field whose type is a union fails once per member; those failures are joined
    into one line ("Input should be a finite number, or Input should be 'sqrt_d_model'").
    The bad value is quoted as a short excerpt only.
    """
    messages: dict[str, list[str]] = {}
    inputs: dict[str, str] = {}
    meant: set[str] = set()  # the fields misspelt keys were most likely meant to be
    for err in exc.errors(include_url=False):
        loc = [p for p in err["loc"] if not _is_union_tag(p)]
        nested = (err.get("ctx") or {}).get("problems") if err["type"] == "invalid_component" else None
        if nested:  # a sub-component's own problems, each at its full path (see params.SubComponent)
            for sub_path, sub_message in nested:
                messages.setdefault(join_path(prefix, [*loc, sub_path]), []).append(sub_message)
            continue
        if err["type"] == "unknown_component":
            loc = [*loc, "kind"]  # where the name is written, as for the model's own components
        path = join_path(prefix, loc)
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            accepted = _accepted_fields(model, loc[:-1])
            message = unknown_message("field", loc[-1], accepted, quote_name=False) if accepted else "unknown field"
            guess = closest(loc[-1], accepted)
            if guess is not None:
                meant.add(join_path(prefix, [*loc[:-1], guess]))
        elif err["type"] == "missing":
            message = _MISSING
        elif "input" in err and err["type"] not in ("unknown_component", "invalid_component") and not (
            isinstance(err["input"], dict) and err["type"] == "value_error"
        ):
            # A check across a whole component's params names the values itself; quoting the mapping is noise.
            inputs.setdefault(path, f" (got {excerpt(err['input'])})")
        if message not in messages.setdefault(path, []):
            messages[path].append(message)
    # `d_modle: unknown field; did you mean 'd_model'?` already says what to do about the missing d_model.
    return [
        Problem(path, ", or ".join(found) + inputs.get(path, ""))
        for path, found in messages.items()
        if not (path in meant and found == [_MISSING])
    ]


_MISSING = "required field is missing"


def _is_union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in _UNION_TAGS or part.startswith(("literal[", "constrained-", "function-")))


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
    "OVERRIDE_FIELDS",
    "BlockSpec",
    "ComponentRef",
    "LayerOverride",
    "MTPBlockChange",
    "MTPSpec",
    "MTP_BLOCK_FIELDS",
    "AdapterTarget",
    "SharedAdapters",
    "SharedBlockSpec",
    "ModelSpec",
    "Spec",
    "apply_change",
    "as_component_ref",
    "problems_from_validation_error",
    "read_spec_file",
    "layer_selection",
    "select_layers",
]
