"""The Jinja sandbox chat templates run in: transformers' immutable sandbox, refusing to build a value over the bound.

One C-level operation can build a gigabyte before :func:`.template_bounds.render_bounded`
looks at the clock again: ``'a' * 10**9``, ``'%0999999999d' % 1``, ``10 ** 10**9``,
``'x'.center(10**9)``, ``big|join``, a macro's text. :class:`BoundedSandbox` intercepts each
operation that can grow its result beyond its operands (the ``+ * ** %`` operators, ``~``,
the ``str`` methods ``center ljust rjust zfill expandtabs replace join format format_map``,
the filters ``center indent format replace join batch sum``, the joining of a block's or a
macro's text), estimates the size of the result from the operands, and refuses one over
the output bound before it is built. Everything else is Jinja's ``ImmutableSandboxedEnvironment``,
so a template that stays within the bound renders exactly as in transformers.
"""

from __future__ import annotations

from functools import update_wrapper
from typing import Any, Callable, Iterable

from jinja2 import pass_environment, pass_eval_context
from jinja2.filters import do_batch, do_center, do_format, do_indent, do_join, do_replace, do_sum
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specformer_text.template_bounds import SIZED, binop_size, join_size, printf_size, refuse_over, \
    replace_size, str_format_size, str_method_size, text_length


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox that refuses to build a value larger than the output bound (see the module doc)."""

    intercepted_binops = frozenset(["+", "*", "**", "%"])

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters.update(center=_bounded_center, indent=_bounded_indent, format=_bounded_format,
                            replace=_bounded_replace, join=_bounded_join, batch=_bounded_batch, sum=_bounded_sum)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        refuse_over(binop_size(operator, left, right), f"a value with {operator!r}")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's signature
        if isinstance(getattr(__obj, "__self__", None), str) and callable(__obj):
            if getattr(__obj, "__name__", None) == "join" and args:
                items = list(args[0])  # an iterator is read once: the estimate and the call share the list
                refuse_over(join_size(__obj.__self__, items), "a string with join")
                args = (items, *args[1:])
            else:
                refuse_over(str_method_size(__obj, args, kwargs), f"a string with {__obj.__name__}")
        return super().call(__context, __obj, *args, **kwargs)

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        formatter = super().wrap_str_format(value)
        if formatter is None:
            return None
        fmt, is_map = value.__self__, value.__name__ == "format_map"

        def bounded(*args: Any, **kwargs: Any) -> str:
            mapping = args[0] if is_map and len(args) == 1 and isinstance(args[0], dict) else kwargs
            refuse_over(str_format_size(fmt, () if is_map else args, mapping), "a string with format")
            return formatter(*args, **kwargs)

        return update_wrapper(bounded, value)

    @staticmethod
    def concat(pieces: Iterable[str]) -> str:  # type: ignore[override]
        """Joins a macro's or a ``{% set %}`` block's output (Jinja's generated code calls ``environment.concat``)."""
        pieces = list(pieces)
        refuse_over(sum(len(p) for p in pieces), "a block's or a macro's text")
        return "".join(pieces)


def bound_tilde(template: Any) -> Any:
    """``template`` with its ``~`` operator bounded too.

    Jinja compiles ``a ~ b`` to a call of ``str_join``/``markup_join``, names its generated
    module imports from ``jinja2.runtime``; they are rebound in that module's namespace (this
    template's own), not in Jinja.
    """
    namespace = template.root_render_func.__globals__

    def bounded(join: Callable[[Iterable[Any]], str]) -> Callable[[Iterable[Any]], str]:
        def joined(values: Iterable[Any]) -> str:
            values = list(values)
            refuse_over(sum(text_length(v) for v in values), "a string with '~'")
            return join(values)
        return joined

    namespace["str_join"] = bounded(str_join)
    namespace["markup_join"] = bounded(markup_join)
    return template


# -- filters that build in one C-level step ------------------------------------------------------------


def _bounded_center(value: Any, width: int = 80) -> str:
    refuse_over(width if isinstance(width, int) else 0, "a string with center")
    return do_center(value, width)


def _bounded_indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> str:
    text = str(s)
    step = width if isinstance(width, int) else len(str(width))
    refuse_over(len(text) + (text.count("\n") + 1) * max(step, 0), "a string with indent")
    return do_indent(s, width, first, blank)


def _bounded_format(value: Any, *args: Any, **kwargs: Any) -> str:
    refuse_over(printf_size(str(value), kwargs or args), "a string with format")
    return do_format(value, *args, **kwargs)


@pass_eval_context
def _bounded_replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: int | None = None) -> str:
    refuse_over(replace_size(str(s), str(old), str(new), count), "a string with replace")
    return do_replace(eval_ctx, s, old, new, count)


@pass_eval_context
def _bounded_join(eval_ctx: Any, value: Iterable[Any], d: str = "", attribute: Any = None) -> str:
    items = list(value)
    # With an attribute each item's own text is an upper estimate of the attribute's.
    refuse_over(join_size(str(d), items), "a string with join")
    return do_join(eval_ctx, items, d, attribute)


def _bounded_batch(value: Iterable[Any], linecount: int, fill_with: Any = None) -> Any:
    refuse_over(linecount if isinstance(linecount, int) else 0, "a batch")
    return do_batch(value, linecount, fill_with)


@pass_environment
def _bounded_sum(environment: Any, iterable: Iterable[Any], attribute: Any = None, start: Any = 0) -> Any:
    items = list(iterable)
    if attribute is None and (isinstance(start, SIZED) or any(isinstance(i, SIZED) for i in items)):
        refuse_over(sum(len(i) for i in [start, *items] if isinstance(i, SIZED)), "a list with sum")
    return do_sum(environment, items, attribute, start)
