"""Validation: a spec's data checked against the registry, every component resolved once.

The layer above the spec's shapes (:mod:`specformer.spec`) and below building.
:func:`validate` checks the structure of the data, each plugin's section, and resolves
every component the model section names into :class:`ResolvedModel`: for each distinct
block, the component and validated params of its layout, norm, attention and ffn, each
remembering the spec path it came from so that a problem found later (while sizing or
building) still points at the right line. What it returns, the spec together with its
resolved model, is what the size check (:mod:`specformer.spec.size_check`) and the builder use:
nothing is resolved twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from specformer.errors import Problem, SpecError, UnknownComponentError
from specformer.spec.layer_groups import LayerGroup, group_layers, membership, overrides_of_layer
from specformer.messages import join_path, unknown_message
from specformer.registry.discovery import get_plugin_manager
from specformer.registry.components import Registry, Resolved
from specformer.spec.shapes import BLOCK_FIELDS, ModelSpec, Spec, problems_from_validation_error


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
class ResolvedModel:
    spec: ModelSpec
    positional: ResolvedPart
    final_norm: ResolvedPart
    residual: ResolvedPart
    groups: list[ResolvedGroup] = field(default_factory=list)
    selections: list["range | frozenset[int]"] = field(default_factory=list)  # which layers each override selects
    per_layer_input: ResolvedPart | None = None  # model.per_layer_input, when the model has one

    @property
    def layers(self) -> list[dict[str, ResolvedPart]]:
        """The parts of every layer, in order (one entry per layer: use :attr:`groups` for sizes)."""
        by_signature = {g.group.overrides: g.parts for g in self.groups}
        return [by_signature[overrides_of_layer(i, self.selections)] for i in range(self.spec.n_layers)]


def resolve_model(model: ModelSpec, registry: Registry) -> tuple[ResolvedModel | None, list[Problem]]:
    """Resolve every component the model section names; report every problem, each once.

    Layers that share a block are resolved once (work grows with the number of
    distinct blocks, not of layers).
    """
    problems: list[Problem] = []
    seen: set[tuple[str, str]] = set()

    def add(problem: Problem) -> None:
        if (problem.path, problem.message) not in seen:
            seen.add((problem.path, problem.message))
            problems.append(problem)

    def resolve(kind: str, ref: dict[str, Any], path: str) -> ResolvedPart | None:
        try:
            return ResolvedPart(registry.resolve(kind, ref), path)
        except UnknownComponentError as exc:
            add(Problem(join_path(path, ["kind"]), str(exc)))
        except ValidationError as exc:
            params_model = registry.get(kind, ref["kind"]).params
            for p in problems_from_validation_error(exc, prefix=path, model=params_model):
                add(p)
        return None

    selections: list[range | list[int]] = []
    for j, override in enumerate(model.layers):
        try:
            selections.append(override.layer_selection(model.n_layers))
        except ValueError as exc:
            add(Problem(join_path("model", ["layers", j, "select"]), str(exc)))
            selections.append([])
    if problems:
        return None, problems

    positional = resolve("positional", model.positional.as_dict(), "model.positional")
    final_path = "model.final_norm" if model.final_norm is not None else "model.block.norm"
    final_norm = resolve("norm", model.final_norm_ref(), final_path)
    residual = resolve("residual", model.block.residual.as_dict(), "model.block.residual")
    per_layer_input = (resolve("per_layer_input", model.per_layer_input.as_dict(), "model.per_layer_input")
                       if model.per_layer_input is not None else None)
    groups = []
    for group in group_layers(model.n_layers, selections):
        block = model.block_with(group.overrides)
        parts = {}
        for f in BLOCK_FIELDS:
            # Where this field came from: the base block, or the last override that touched it.
            origin = join_path("model", ["block", f])
            for j in group.overrides:
                if getattr(model.layers[j], f) is not None:
                    origin = join_path("model", ["layers", j, f])
            part = resolve("layout" if f == "layout" else f, block[f], origin)
            if part is not None:
                parts[f] = part
        # The scheme inside attention: model.positional's own part unless the block or an override sets one.
        origin = "model.block.positional" if model.block.positional is not None else None
        for j in group.overrides:
            if model.layers[j].positional is not None:
                origin = join_path("model", ["layers", j, "positional"])
        if origin is None:
            if positional is not None:
                parts["positional"] = positional
        else:
            part = resolve("positional", block["positional"], origin)
            if part is not None:
                parts["positional"] = part
        groups.append(ResolvedGroup(group, parts))
    if problems or positional is None or final_norm is None or residual is None:
        return None, problems
    return ResolvedModel(spec=model, positional=positional, final_norm=final_norm, residual=residual, groups=groups,
                         selections=membership(selections), per_layer_input=per_layer_input), []


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
    """Check the structure, the sections and every component; raise :class:`SpecError` with all problems found."""
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        # The plugins' sections do not depend on the model section: report theirs too, all at once.
        sections = Spec.model_construct(**{k: v for k, v in data.items() if k != "model"}) if isinstance(data, dict) else None
        problems = validate_sections(sections, registry) if sections is not None else []
        raise SpecError(problems + problems_from_validation_error(exc, model=Spec), source=source) from None
    problems = validate_sections(spec, registry)
    resolved, model_problems = resolve_model(spec.model, registry)
    problems += model_problems
    if problems or resolved is None:
        raise SpecError(problems, source=source)
    return ValidatedSpec(spec=spec, resolved=resolved)


def plugin_problems(spec: Spec, registry: Registry) -> list[Problem]:
    """What the plugins' ``specformer_validate_spec`` hooks find wrong with a spec that validated."""
    problems = []
    for result in get_plugin_manager().hook.specformer_validate_spec(spec=spec, registry=registry):
        for item in result or []:
            problems.append(item if isinstance(item, Problem) else Problem("", str(item)))
    return problems


__all__ = ["ResolvedGroup", "ResolvedModel", "ResolvedPart", "ValidatedSpec", "plugin_problems", "resolve_model",
           "validate", "validate_sections"]
