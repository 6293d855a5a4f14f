"""Helpers for writing a component's ``Params`` model.

``Params`` models are plain pydantic models with ``extra="forbid"``. A param that is
itself a component (an attention's ``qk_norm``, a RoPE ``scaling``) is declared with
:func:`SubComponent`; after validation it holds a :class:`~specformer.registry.Resolved`
whose ``make(**sizes)`` the parent calls with the sizes only it knows.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
)
from pydantic_core import PydanticCustomError

from specformer.errors import UnknownComponentError, excerpt
from specformer.registry import Resolved


class StrictNumbers(BaseModel):
    """Numbers are numbers: the base of every model a spec is validated by.

    pydantic's lax mode reads ``true`` as 1 in an ``int`` field and accepts ``inf`` and
    ``nan`` in a ``float`` field; in a spec both are mistakes (``n_layers: true`` would
    build one layer, ``init_std: .inf`` NaN weights). Here a boolean given for a field
    whose type holds a number but no ``bool`` is refused, and so is a non-finite float
    (a field that truly wants one can say ``Field(allow_inf_nan=True)``).
    """

    model_config = ConfigDict(allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) or (isinstance(value, list) and any(isinstance(v, bool) for v in value)):
            field = cls.model_fields.get(info.field_name or "")
            if field is not None and _numeric_without_bool(field.annotation):
                raise PydanticCustomError("bool_not_number", "a boolean is not a number here; write a number")
        return value


def _numeric_without_bool(annotation: Any) -> bool:
    """Whether a type admits int or float (also inside a list or union) but never bool."""
    leaves: set[Any] = set()
    stack = [annotation]
    while stack:
        t = stack.pop()
        args = get_args(t)
        if args and get_origin(t) is not Literal:
            stack.extend(args)
        else:
            leaves.add(t)
    return bool(leaves & {int, float}) and bool not in leaves


class Params(StrictNumbers):
    """Base class for component params: unknown keys are errors, values are re-validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


COMPONENT_MARKER = "x-specformer-component"


def component_schema_ref(kind: str) -> dict[str, str]:
    """Where `specformer schema` puts the union of every registered component of ``kind``."""
    return {"$ref": f"#/$defs/{kind}-component"}


def component_schema_marker(kind: str) -> dict[str, str]:
    """The schema a Params model shows for a sub-component; `specformer schema` swaps it for the union."""
    return {"type": "object", COMPONENT_MARKER: kind, "description": f"a {kind} component"}


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


def SubComponent(kind: str) -> Any:  # noqa: N802 - reads as a type in annotations
    """Annotate a Params field whose value is a component of ``kind`` (validated against the registry)."""

    def validate(value: Any, info: Any) -> Resolved:
        if isinstance(value, Resolved):
            return value
        try:
            ref = as_component_ref(value)
        except ValueError as exc:
            raise PydanticCustomError("component_ref", str(exc)) from None
        from specformer.plugins import get_registry  # late: plugins imports the registry

        registry = (info.context or {}).get("registry") or get_registry()
        try:
            return registry.resolve(kind, ref, context=info.context)
        except UnknownComponentError as exc:
            raise PydanticCustomError("unknown_component", str(exc)) from None
        except ValidationError as exc:
            from specformer.spec import problems_from_validation_error  # late: spec imports this module

            # The sub-component's own problems, at paths relative to it (`k`, `[0].p`); the
            # spec's error report places each at its full path (`generate.sampler[1].k`).
            problems = problems_from_validation_error(exc, model=registry.get(kind, ref["kind"]).params)
            raise PydanticCustomError(
                "invalid_component",
                "{name}: {detail}",
                {"name": ref["kind"], "detail": "; ".join(map(str, problems)),
                 "problems": [(p.path, p.message) for p in problems]},
            ) from None

    return Annotated[
        Any,
        PlainValidator(validate),
        PlainSerializer(lambda r: r.to_dict(), return_type=dict),
        WithJsonSchema(component_schema_marker(kind)),
    ]


__all__ = ["Params", "StrictNumbers", "SubComponent", "as_component_ref", "component_schema_ref"]
