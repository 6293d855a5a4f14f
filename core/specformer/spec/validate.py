"""Validation: a spec's data checked against the registry, every component resolved once.

The layer above the spec's shapes (:mod:`specformer.spec`) and below building.
:func:`validate` checks the structure of the data, each plugin's section, and resolves
every component the model section names into :class:`ResolvedModel`: for each distinct
block, the component and validated params of its layout, norm, mixer and ffn, each
remembering the spec path it came from so that a problem found later (while sizing or
building) still points at the right line. What it returns, the spec together with its
resolved model, is what the size check (:mod:`specformer.spec.size_check`) and the builder use:
nothing is resolved twice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from specformer.errors import Problem, SpecError, UnknownComponentError
from specformer.spec.layer_groups import LayerGroup, group_layers, membership, overrides_of_layer
from specformer.messages import join_path, unknown_message
from specformer.registry.discovery import get_plugin_manager
from specformer.registry.components import Registry, Resolved
from specformer.spec.file_order import in_file_order
from specformer.spec.shapes import (
    MTP_BLOCK_FIELDS,
    BLOCK_FIELDS,
    OVERRIDE_FIELDS,
    LayerOverride,
    ModelSpec,
    Spec,
    apply_change,
    as_component_ref,
    problems_from_validation_error,
)


@dataclass
class ResolvedPart:
    """A resolved component and the spec path it was written at."""

    resolved: Resolved
    path: str


@dataclass
class ResolvedGroup:
    """The layers that share one block (see :mod:`specformer.spec.layer_groups`) and its resolved parts."""

    group: LayerGroup
    parts: dict[str, ResolvedPart]


@dataclass
class ResolvedMTP:
    """``model.mtp`` resolved: the block each depth runs (the model's block with ``mtp.block``'s changes), the
    norm of its two inputs and its final norm."""

    depths: int
    parts: dict[str, ResolvedPart]  # layout, norm, mixer, ffn, positional (model.positional's own part unless changed)
    input_norm: ResolvedPart
    final_norm: ResolvedPart


@dataclass
class ResolvedModel:
    spec: ModelSpec
    positional: ResolvedPart
    final_norm: ResolvedPart
    residual: ResolvedPart
    groups: list[ResolvedGroup] = field(default_factory=list)
    selections: list["range | frozenset[int]"] = field(default_factory=list)  # which layers each override selects
    per_layer_input: ResolvedPart | None = None  # model.per_layer_input, when the model has one
    embedding_norm: ResolvedPart | None = None  # model.embedding_norm, when the model has one
    mtp: ResolvedMTP | None = None  # model.mtp, when the model has multi-token prediction depths
    # model.shared_blocks: each block's parts by name (layout, norm, mixer, ffn), and the layers that use it.
    shared_blocks: dict[str, dict[str, ResolvedPart]] = field(default_factory=dict)

    @property
    def shared_uses(self) -> list[str | None]:
        """The shared block run before each layer's own block (model.layers[].shared), None where none runs."""
        by_signature = {g.group.overrides: self.spec.shared_of(g.group.overrides) for g in self.groups}
        return [by_signature[overrides_of_layer(i, self.selections)] for i in range(self.spec.n_layers)]

    @property
    def layers(self) -> list[dict[str, ResolvedPart]]:
        """The parts of every layer, in order (one entry per layer: use :attr:`groups` for sizes)."""
        by_signature = {g.group.overrides: g.parts for g in self.groups}
        return [by_signature[overrides_of_layer(i, self.selections)] for i in range(self.spec.n_layers)]


#: The registry kind of each block field a spec writes.
_KIND_OF = {"layout": "layout", "norm": "norm", "mixer": "mixer", "ffn": "ffn", "positional": "positional",
            "residual": "residual", "final_norm": "norm", "embedding_norm": "norm",
            "per_layer_input": "per_layer_input"}


@dataclass
class _Resolver:
    """Resolves components, collecting every problem once, each at the place the file writes its value."""

    registry: Registry
    problems: list[Problem] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)

    def add(self, problem: Problem) -> None:
        if (problem.path, problem.message) not in self.seen:
            self.seen.add((problem.path, problem.message))
            self.problems.append(problem)

    def resolve(self, kind: str, ref: dict[str, Any], path: str, written: "Written | None" = None) -> ResolvedPart | None:
        """The component ``ref`` of ``kind`` at ``path``, or None with its problems added.

        ``written`` says where a merged component's params were written (a layer override
        merges into the block's): a problem with a param the block wrote is the block's,
        reported there, not once more at every override that merges into it.
        """
        try:
            return ResolvedPart(self.registry.resolve(kind, ref), path)
        except UnknownComponentError as exc:
            self.add(Problem(self._place(join_path(path, ["kind"]), path, kind, written), str(exc)))
        except ValidationError as exc:
            for p in self._problems(kind, ref, path, exc):
                self.add(Problem(self._place(p.path, path, kind, written, p.message), p.message))
        return None

    def _problems(self, kind: str, ref: dict[str, Any], path: str, exc: ValidationError) -> list[Problem]:
        return problems_from_validation_error(exc, prefix=path, model=self.registry.get(kind, ref["kind"]).params)

    def _place(self, at: str, path: str, kind: str, written: "Written | None", message: str | None = None) -> str:
        """Where the value a problem at ``at`` is about was written (``path`` is where it was merged)."""
        if written is None or written.base is None:
            return at
        step = re.match(r"\.([^.\[]+)", at[len(path):]) if at.startswith(path) else None
        if step is not None:  # a param's own problem: where the param is written
            where = written.params.get(step[1])
            return where + at[len(path):] if where is not None else at
        # A check across the whole component: the block's, when the block's component alone fails it the same way.
        base_ref, base_path = written.base
        if at == path and message is not None:
            try:
                self.registry.resolve(kind, base_ref)
            except ValidationError as exc:
                if any(p.path == base_path and p.message == message for p in self._problems(kind, base_ref, base_path, exc)):
                    return base_path
            except UnknownComponentError:
                pass
        return at


@dataclass(frozen=True)
class Written:
    """Where the params of a component merged from the block and layer overrides were written."""

    params: dict[str, str]  # param -> the path of the component that wrote it (the block's or an override's)
    base: tuple[dict[str, Any], str] | None  # the block's own component and its path, while no override replaced it


def merge_written(base: dict[str, Any], base_path: str,
                  changes: list[tuple[str, "dict[str, Any] | str"]]) -> tuple[dict[str, Any], Written | None]:
    """The block's component with overrides' ``(path, change)`` applied in order, and where each param came from."""
    if not changes:
        return base, None
    merged, params = dict(base), {k: base_path for k in base}
    kept_base: tuple[dict[str, Any], str] | None = (base, base_path)
    for path, change in changes:
        merged, replaced = apply_change(merged, change)
        if replaced:
            params, kept_base = {}, None
        params.update({k: path for k in (as_component_ref(change) if isinstance(change, str) else change)})
    return merged, Written(params, kept_base)


def resolve_model(model: ModelSpec, registry: Registry) -> tuple[ResolvedModel | None, list[Problem]]:
    """Resolve every component the model section names; report every problem, each once, where it is written.

    Layers that share a block are resolved once (work grows with the number of
    distinct blocks, not of layers). An override whose ``select`` is wrong is still
    checked, merged into the block alone.
    """
    resolver = _Resolver(registry)
    resolve = resolver.resolve

    selections: list[range | list[int]] = []
    bad_selects: list[int] = []
    for j, override in enumerate(model.layers):
        try:
            selections.append(override.layer_selection(model.n_layers))
        except ValueError as exc:
            resolver.add(Problem(join_path("model", ["layers", j, "select"]), str(exc)))
            selections.append([])
            bad_selects.append(j)

    positional = resolve("positional", model.positional.as_dict(), "model.positional")
    final_path = "model.final_norm" if model.final_norm is not None else "model.block.norm"
    final_norm = resolve("norm", model.final_norm_ref(), final_path)
    residual = resolve("residual", model.block.residual.as_dict(), "model.block.residual")
    per_layer_input = (resolve("per_layer_input", model.per_layer_input.as_dict(), "model.per_layer_input")
                       if model.per_layer_input is not None else None)
    embedding_norm = (resolve("norm", model.embedding_norm.as_dict(), "model.embedding_norm")
                      if model.embedding_norm is not None else None)

    def merged_part(f: str, changes: list[tuple[str, "dict[str, Any] | str"]]) -> ResolvedPart | None:
        """Block field ``f`` with ``changes`` (``(path, change)``, a layer override's or model.mtp.block's) merged."""
        if f == "positional" and model.block.positional is None:
            if not changes:
                return positional  # the scheme inside attention is model.positional's own part
            base, base_path = model.positional.as_dict(), "model.positional"
        else:
            base, base_path = getattr(model.block, f).as_dict(), join_path("model", ["block", f])
        ref, written = merge_written(base, base_path, changes)
        return resolve(_KIND_OF[f], ref, changes[-1][0] if changes else base_path, written)

    def block_parts(overrides: tuple[int, ...], fields: tuple[str, ...] = OVERRIDE_FIELDS) -> dict[str, ResolvedPart]:
        parts = {}
        for f in fields:
            changes = [(join_path("model", ["layers", j, f]), getattr(model.layers[j], f)) for j in overrides
                       if getattr(model.layers[j], f) is not None]
            if (part := merged_part(f, changes)) is not None:
                parts[f] = part
        return parts

    groups = [ResolvedGroup(group, block_parts(group.overrides)) for group in group_layers(model.n_layers, selections)]
    mtp = _resolve_mtp(model, resolve, merged_part) if model.mtp is not None else None
    shared_blocks = {name: {f: part for f in BLOCK_FIELDS
                            if (part := resolve(_KIND_OF[f], getattr(block, f).as_dict(),
                                                join_path("model", ["shared_blocks", name, f]))) is not None}
                     for name, block in model.shared_blocks.items()}
    for problem in shared_reference_problems(model, [g.group.overrides for g in groups]):
        resolver.add(problem)
    for j in bad_selects:  # selects no layer it can name, but its changes are checked all the same
        block_parts((j,), tuple(f for f in OVERRIDE_FIELDS if getattr(model.layers[j], f) is not None))
    if resolver.problems or positional is None or final_norm is None or residual is None:
        return None, resolver.problems
    return ResolvedModel(spec=model, positional=positional, final_norm=final_norm, residual=residual, groups=groups,
                         selections=membership(selections), per_layer_input=per_layer_input,
                         embedding_norm=embedding_norm, mtp=mtp, shared_blocks=shared_blocks), []


def _resolve_mtp(model: ModelSpec, resolve: Any, merged_part: Any) -> ResolvedMTP | None:
    """``model.mtp``'s parts: its block is ``model.block`` (no layer override) with ``mtp.block``'s changes merged,
    each field as a layer override's (``merged_part``), its positional scheme too: the model's unless it names one."""
    assert model.mtp is not None
    spec = model.mtp
    parts: dict[str, ResolvedPart] = {}
    for f in (*MTP_BLOCK_FIELDS, "positional"):
        change = getattr(spec.block, f)
        part = merged_part(f, [] if change is None else [(join_path("model", ["mtp", "block", f]), change)])
        if part is not None:
            parts[f] = part
    input_norm = (resolve("norm", spec.input_norm.as_dict(), "model.mtp.input_norm") if spec.input_norm is not None
                  else parts.get("norm"))
    final_norm = (resolve("norm", spec.final_norm.as_dict(), "model.mtp.final_norm") if spec.final_norm is not None
                  else resolve("norm", model.final_norm_ref(),
                               "model.final_norm" if model.final_norm is not None else "model.block.norm"))
    if len(parts) != len(MTP_BLOCK_FIELDS) + 1 or input_norm is None or final_norm is None:
        return None
    return ResolvedMTP(depths=spec.depths, parts=parts, input_norm=input_norm, final_norm=final_norm)


def shared_reference_problems(model: ModelSpec, signatures: list[tuple[int, ...]]) -> list[Problem]:
    """Every ``model.layers[].shared`` names a block of ``model.shared_blocks``, and every shared block is used.

    ``signatures``: the overrides of each group of layers, to find the blocks that some layer runs
    (an override that a later one replaces everywhere uses nothing).
    """
    problems = []
    defined = sorted(model.shared_blocks)
    for j, override in enumerate(model.layers):
        if override.shared is not None and override.shared not in model.shared_blocks:
            problems.append(Problem(join_path("model", ["layers", j, "shared"]),
                                    unknown_message("shared block", override.shared, defined,
                                                    accepted="model.shared_blocks defines")
                                    if defined else f"unknown shared block {override.shared!r}: model.shared_blocks "
                                                    f"defines none; add it there"))
    used = {model.shared_of(signature) for signature in signatures}
    for name in defined if not problems else ():  # a misspelt name leaves its block unused: one problem, not two
        if name not in used:
            problems.append(Problem(join_path("model", ["shared_blocks", name]),
                                    f"shared block {name!r} is run by no layer; name it in a model.layers entry "
                                    f"(shared: {name}) or remove it"))
    return problems


def check_as_written(data: Any, registry: Registry) -> tuple[list[Problem], list[str]]:
    """Each component of a model section whose structure is wrong, checked where the file writes it.

    The structure's own problems (an unknown field, a missing size) do not hide those of the
    components beside them: every component written as a name or a mapping with a ``kind``
    is checked against its kind, and an override's change merged into the block's component
    (when the block's is written). Returns the problems, and the checks that could not be
    made (layer selections need a valid ``n_layers``).
    """
    resolver = _Resolver(registry)
    if not isinstance(data, dict):
        return [], []

    def ref_of(value: Any) -> dict[str, Any] | None:
        try:
            return as_component_ref(value) if value is not None else None
        except ValueError:
            return None  # not a component: the structure's problem, reported with it

    for name in ("positional", "final_norm", "embedding_norm", "per_layer_input"):
        if (ref := ref_of(data.get(name))) is not None:
            resolver.resolve(_KIND_OF[name], ref, join_path("model", [name]))
    block = data.get("block") if isinstance(data.get("block"), dict) else {}
    bases: dict[str, tuple[dict[str, Any], str]] = {"layout": ({"kind": "prenorm"}, "model.block.layout")}
    if (ref := ref_of(data.get("positional"))) is not None:
        bases["positional"] = (ref, "model.positional")
    for f in (*OVERRIDE_FIELDS, "residual"):
        if (ref := ref_of(block.get(f))) is not None:
            path = join_path("model", ["block", f])
            bases[f] = (ref, path)
            resolver.resolve(_KIND_OF[f], ref, path)

    n_layers = data.get("n_layers")
    counted = isinstance(n_layers, int) and not isinstance(n_layers, bool) and n_layers > 0
    layers = data.get("layers")
    not_checked = []
    for j, raw in enumerate(layers if isinstance(layers, list) else []):
        if not isinstance(raw, dict):
            continue
        try:
            override = LayerOverride.model_validate(raw)
        except ValidationError:
            continue  # its structure's problems are reported with the model's
        if counted:
            try:
                override.layer_selection(n_layers)
            except ValueError as exc:
                resolver.add(Problem(join_path("model", ["layers", j, "select"]), str(exc)))
        elif "the layer selections (they need a valid n_layers)" not in not_checked:
            not_checked.append("the layer selections (they need a valid n_layers)")
        for f in OVERRIDE_FIELDS:
            change = getattr(override, f)
            path = join_path("model", ["layers", j, f])
            if change is None or (ref_of(change) if isinstance(change, str) else change) is None:
                continue
            if f not in bases and not (isinstance(change, str) or "kind" in change):
                continue  # merges into a block component that is not there: the block's problem
            base, base_path = bases.get(f, ({}, ""))
            ref, written = merge_written(base, base_path, [(path, change)])
            resolver.resolve(_KIND_OF[f], ref, path, written)
    return resolver.problems, not_checked


def validate_sections(spec: Spec, registry: Registry) -> list[Problem]:
    """Validate each top-level section other than ``model`` by the model its plugin registered."""
    problems = []
    extras = spec.model_extra or {}
    for name in list(extras):
        if name not in registry.sections:
            known = ["model", *sorted(registry.sections)]
            problems.append(Problem(name, unknown_message("section", name, known, accepted="accepted sections",
                                                          quote_name=False)))
            continue
        section_model, _plugin = registry.sections[name]
        try:
            extras[name] = section_model.model_validate(extras[name] or {}, context={"registry": registry})
        except ValidationError as exc:
            problems += problems_from_validation_error(exc, prefix=name, model=section_model)
    return problems


@dataclass
class ValidatedSpec:
    """A spec whose structure and sections are valid, with every component of its model resolved."""

    spec: Spec
    resolved: ResolvedModel


def validate(data: dict[str, Any], *, registry: Registry, source: str | None = None) -> ValidatedSpec:
    """Check the structure, the sections and every component; raise :class:`SpecError` with all problems found.

    Every part that can be checked on its own is, whatever is wrong beside it: the plugins'
    sections, and each component against its kind even when the model section's structure
    is wrong. The problems come in the order their places are written in the file.
    """
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        # The plugins' sections and the components do not depend on the rest of the model section.
        sections = Spec.model_construct(**{k: v for k, v in data.items() if k != "model"}) if isinstance(data, dict) else None
        problems = validate_sections(sections, registry) if sections is not None else []
        problems += problems_from_validation_error(exc, model=Spec)
        components, not_checked = check_as_written(data.get("model") if isinstance(data, dict) else None, registry)
        raise SpecError(in_file_order(problems + components, data), source=source, not_checked=not_checked) from None
    problems = validate_sections(spec, registry)
    resolved, model_problems = resolve_model(spec.model, registry)
    problems += model_problems
    if problems or resolved is None:
        raise SpecError(in_file_order(problems, data), source=source)
    return ValidatedSpec(spec=spec, resolved=resolved)


def plugin_problems(spec: Spec, registry: Registry) -> list[Problem]:
    """What the plugins' ``specformer_validate_spec`` hooks find wrong with a spec that validated."""
    problems = []
    for result in get_plugin_manager().hook.specformer_validate_spec(spec=spec, registry=registry):
        for item in result or []:
            problems.append(item if isinstance(item, Problem) else Problem("", str(item)))
    return problems


__all__ = ["ResolvedGroup", "ResolvedMTP", "ResolvedModel", "ResolvedPart", "ValidatedSpec", "Written", "check_as_written",
           "merge_written", "plugin_problems", "resolve_model", "validate", "validate_sections"]
