"""Numbers are numbers: the base class of every pydantic model a spec is validated by.

It sits at the bottom of the core so that the spec's own shapes (:mod:`specformer.spec`)
and the components' ``Params`` (:mod:`specformer.registry.params`) share it without importing
each other.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import AllowInfNan, BaseModel, BeforeValidator, ConfigDict, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

_NOT_A_NUMBER = "a boolean is not a number here; write a number"


class StrictNumbers(BaseModel):
    """Numbers are numbers: the base of every model a spec is validated by.

    pydantic's lax mode reads ``true`` as 1 in an ``int`` field and accepts ``inf`` and
    ``nan`` in a ``float`` field; in a spec both are mistakes (``n_layers: true`` would
    build one layer, ``init_std: .inf`` NaN weights). Here a boolean given for a field
    whose type holds a number but no ``bool`` is refused, and so is a non-finite float
    (a field that truly wants one can say ``Field(allow_inf_nan=True)``).
    """

    # defer_build: a model's validator is built when it first validates, not when its class is
    # defined. Registering the plugins defines a hundred Params classes, and `specformer --help`
    # validates none of them (benchmarks/bench_startup.py).
    model_config = ConfigDict(allow_inf_nan=False, defer_build=True)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_as_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) or (isinstance(value, (list, tuple)) and any(isinstance(v, bool) for v in value)):
            field = cls.model_fields.get(info.field_name or "")
            if field is not None and _numeric_without_bool(field.annotation):
                raise PydanticCustomError("bool_not_number", _NOT_A_NUMBER)
        return value


def _refuse_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", _NOT_A_NUMBER)
    return value


#: StrictNumbers' rule for one field of a model that does not derive from it (a plain
#: ``BaseModel`` nested in a spec): an int, never a boolean.
StrictInt = Annotated[int, BeforeValidator(_refuse_bool)]
#: The same for a real number: finite, never a boolean.
StrictFloat = Annotated[float, AllowInfNan(False), BeforeValidator(_refuse_bool)]


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


__all__ = ["StrictFloat", "StrictInt", "StrictNumbers"]
