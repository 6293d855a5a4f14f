"""Helpers for writing a component's ``Params`` model.

``Params`` models are plain pydantic models with ``extra="forbid"``. A param that is
itself a component (an attention's ``qk_norm``, a RoPE ``scaling``) is declared with
:func:`SubComponent`; after validation it holds a :class:`~specformer.registry.components.Resolved`
whose ``make(**sizes)`` the parent calls with the sizes only it knows.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, PlainSerializer, PlainValidator, ValidationError, WithJsonSchema
from pydantic_core import PydanticCustomError

from specformer.errors import Problem, SpecError, UnknownComponentError, problems_line
from specformer.messages import join_path
from specformer.registry.discovery import get_registry
from specformer.registry.components import Resolved
from specformer.model.sized import Sized
from specformer.spec.shapes import as_component_ref, problems_from_validation_error
from specformer.spec.strict import StrictNumbers


class Params(StrictNumbers):
    """Base class for component params: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    def sized(self, **sizes: Any) -> Sized:
        """The component's size check: the facts of its module for these sizes, or ValueError (see :class:`Sized`).

        Override it with the sizes the constructor takes, named the same (``*, d_model: int``).
        This default declares nothing (``NotImplemented``): validation then builds the
        component on the meta device to check its sizes.
        """
        return NotImplemented


COMPONENT_MARKER = "x-specformer-component"


def component_schema_ref(kind: str) -> dict[str, str]:
    """Where `specformer schema` puts the union of every registered component of ``kind``."""
    return {"$ref": f"#/$defs/{kind}-component"}


def component_schema_marker(kind: str) -> dict[str, str]:
    """The schema a Params model shows for a sub-component; `specformer schema` swaps it for the union."""
    return {"type": "object", COMPONENT_MARKER: kind, "description": f"a {kind} component"}


def SubComponent(kind: str) -> Any:  # noqa: N802 - reads as a type in annotations
    """Annotate a Params field whose value is a component of ``kind`` (validated against the registry)."""

    def validate(value: Any, info: Any) -> Resolved:
        if isinstance(value, Resolved):
            return value
        try:
            ref = as_component_ref(value)
        except ValueError as exc:
            raise PydanticCustomError("component_ref", str(exc)) from None
        registry = (info.context or {}).get("registry") or get_registry()
        try:
            return registry.resolve(kind, ref, context=info.context)
        except UnknownComponentError as exc:
            raise PydanticCustomError("unknown_component", str(exc)) from None
        except ValidationError as exc:
            # The sub-component's own problems, at paths relative to it (`k`, `[0].p`); the
            # spec's error report places each at its full path (`generate.sampler[1].k`).
            problems = problems_from_validation_error(exc, model=registry.get(kind, ref["kind"]).params)
            raise PydanticCustomError(
                "invalid_component",
                "{name}: {detail}",
                {"name": ref["kind"], "detail": problems_line(problems),
                 "problems": [(p.path, p.message) for p in problems]},
            ) from None

    return Annotated[
        Any,
        PlainValidator(validate),
        PlainSerializer(lambda r: r.to_dict(), return_type=dict),
        WithJsonSchema(component_schema_marker(kind)),
    ]


def resolve_component(kind: str, value: Any, *, path: str, registry: Any = None) -> Resolved:
    """The ``kind`` component ``value`` names (``"int8"`` or ``{"kind": "lora", "rank": 8}``), validated.

    For a component read from somewhere other than a spec (a checkpoint's header, a
    flag): a mistake is a :class:`~specformer.errors.SpecError` whose problems are
    located under ``path`` and worded as a spec's are, one per field
    (``adapter.rank: Input should be less than or equal to 4096 (got 1000000000)``),
    never pydantic's own multi-line text.
    """
    registry = registry if registry is not None else get_registry()
    try:
        ref = as_component_ref(value)
    except ValueError as exc:  # a number, a list, a mapping without a string 'kind'
        raise SpecError([Problem(path, str(exc))]) from None
    try:
        return registry.resolve(kind, ref)
    except UnknownComponentError as exc:
        raise SpecError([Problem(join_path(path, ["kind"]), str(exc))]) from None
    except ValidationError as exc:
        params_model = registry.get(kind, ref["kind"]).params
        raise SpecError(problems_from_validation_error(exc, prefix=path, model=params_model)) from None


__all__ = ["Params", "Sized", "StrictNumbers", "SubComponent", "as_component_ref", "component_schema_ref",
           "resolve_component"]
