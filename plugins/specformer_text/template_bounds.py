"""Bounds on rendering an untrusted chat template: its running time, its output, the size of what it builds.

(This module needs no Jinja; the sandbox that keeps the value bound is :mod:`.template_sandbox`.)

A chat template comes from a checkpoint or a ``tokenizer_config.json``: code written by
someone else. Jinja's sandbox keeps it away from Python's internals but not from loops that
never end (nested ``range`` loops, a macro that calls itself) or from values that fill the
memory (``'a' * 10**9``, ``'%0999999999d' % 1``, ``10 ** 10**9``). :func:`render_bounded`
renders a compiled template within a :class:`Bounds` and turns every way a template can
blow up into one :class:`BoundExceeded` (or the error Python raised: RecursionError,
MemoryError, OverflowError, ValueError), which :mod:`.chat_template` reports as a
``TemplateError``.

How each bound is kept, and why this way:

- Time. The template runs in the calling thread under a trace function (``sys.settrace``,
  which affects that thread only) that compares the clock with the deadline on every line
  and call, and raises when it is past. The exception aborts the template where it stands,
  so nothing keeps running after the deadline (a watchdog thread cannot stop Python code,
  and a subprocess per render would cost more than the render). Tracing slows a render
  down a few times; a chat template renders in about a millisecond, so the price is small.
- Output. The template is run with ``generate()``, and its output is counted as it
  streams; the render stops once it is over the bound.
- Values. One C-level operation (``*``, ``**``, ``%``, ``+``, ``~``, ``str.center``,
  ``str.join``, the ``format``/``join``/``indent``/... filters) can build a gigabyte
  before the next line is traced. The sandbox (:mod:`.template_sandbox`) estimates the size of each such
  result from its operands first and refuses one over the output bound: no value a
  template builds may be longer than its whole output may be.

The bound errors derive from ``BaseException`` so that no ``except Exception`` on the way
(Jinja's own runtime has some) can swallow them and let the template run on.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from itertools import chain
from dataclasses import dataclass
from typing import Any

#: Seconds a template may render for.
DEFAULT_TIMEOUT = 1.0
#: Characters a rendering may produce (1 MiB of ASCII text); also the most characters or items
#: of any one value the template builds.
DEFAULT_MAX_OUTPUT = 2**20


@dataclass(frozen=True)
class Bounds:
    """How long a template may run and how much it may produce."""

    timeout: float = DEFAULT_TIMEOUT
    max_output: int = DEFAULT_MAX_OUTPUT

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f"a chat template's time bound must be above 0 seconds, got {self.timeout}")
        if self.max_output < 1:
            raise ValueError(f"a chat template's output bound must be at least 1 character, got {self.max_output}")


class BoundExceeded(BaseException):
    """A template ran past a bound; the message says which (BaseException: no ``except Exception`` stops it)."""


_active = threading.local()


class _NotWhileCompiling(ValueError):
    """Jinja folds constant filter calls while it compiles, and gives up on one that raises an Exception.

    Outside a render there are no bounds to apply yet, so a large value is left to be built
    at run time, under the bounds of that render.
    """


def refuse_over(size: int, what: str) -> None:
    """Raise BoundExceeded when a value of ``size`` (characters, items, bytes) is over the output bound."""
    bounds = getattr(_active, "bounds", None)
    limit = bounds.max_output if bounds is not None else DEFAULT_MAX_OUTPUT
    if size <= limit:
        return
    if bounds is None:
        raise _NotWhileCompiling(f"{what}: not built while compiling")
    raise BoundExceeded(f"tried to build {what} of about {size:,} characters or items, over its size bound of "
                        f"{limit:,}")


def render_bounded(template: Any, variables: dict[str, Any], *, bounds: Bounds) -> str:
    """The text of a template compiled in :class:`.template_sandbox.BoundedSandbox`, rendered within ``bounds``.

    Raises BoundExceeded past a bound; whatever else the template raises passes through.
    """
    deadline = time.monotonic() + bounds.timeout
    clock = time.monotonic
    running = True

    def trace(frame: Any, event: str, arg: Any) -> Any:
        # Frames entered while tracing keep this function as their line tracer, even after
        # the previous tracer is back: once the render is over it must stay quiet.
        if running and clock() > deadline:
            raise BoundExceeded(f"ran longer than its time bound of {bounds.timeout:g} s")
        return trace if running else None

    pieces: list[str] = []
    size = 0
    previous = sys.gettrace()
    _active.bounds = bounds
    stream = template.generate(**variables)
    sys.settrace(trace)
    try:
        for piece in stream:
            size += len(piece)
            if size > bounds.max_output:
                raise BoundExceeded(f"produced more than its output bound of {bounds.max_output:,} characters")
            pieces.append(piece)
    finally:
        running = False
        sys.settrace(previous)
        _active.bounds = None
        stream.close()
    return "".join(pieces)


# -- estimates of what one operation would build ----------------------------------------------------

SIZED = (str, list, tuple, bytes)
#: printf-style conversions: the width and precision are what can make one huge.
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
#: The numbers in a str.format field's spec ("{:>80}", "{0:.3f}"), and a nested field ("{:{w}}").
_FORMAT_FIELD = re.compile(r"\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}")


def text_length(value: Any) -> int:
    return len(value) if isinstance(value, str) else len(str(value))


def binop_size(operator: str, left: Any, right: Any) -> int:
    """An upper estimate of the size of ``left <operator> right`` (characters, items, or bytes of an int)."""
    if operator == "+" and isinstance(left, SIZED) and isinstance(right, SIZED):
        return len(left) + len(right)
    if operator == "*":
        for seq, count in ((left, right), (right, left)):
            if isinstance(seq, SIZED) and isinstance(count, int):
                return len(seq) * max(count, 0)
        if isinstance(left, int) and isinstance(right, int):
            return (left.bit_length() + right.bit_length()) // 8
    if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        return left.bit_length() * right // 8
    if operator == "%" and isinstance(left, str):
        return printf_size(left, right)
    return 0


def printf_size(fmt: str, args: Any) -> int:
    """An upper estimate of the length of ``fmt % args``: each conversion as wide as the widest argument or width."""
    values = list(args.values()) if isinstance(args, dict) else list(args) if isinstance(args, tuple) else [args]
    widest = max((text_length(v) for v in values), default=0)
    # Built from C-level calls only: a format of 100,000 conversions is read in no time even when traced.
    specs = _PRINTF.findall(fmt)
    widest = max(widest, max(map(int, filter(str.isdigit, chain.from_iterable(specs))), default=0))
    if "*" in chain.from_iterable(specs):  # a width taken from the arguments
        widest = max([widest] + [v for v in values if isinstance(v, int)])
    return len(fmt) + len(specs) * widest


def str_format_size(fmt: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """An upper estimate of the length of ``fmt.format(*args, **kwargs)``."""
    values = list(args) + list(kwargs.values())
    widest = max((text_length(v) for v in values), default=0)
    fields = _FORMAT_FIELD.findall(fmt)
    for field in fields:
        _, _, spec = field[1:-1].partition(":")
        widest = max([widest] + [int(n) for n in re.findall(r"\d+", spec)])
        if "{" in spec:  # a nested field: its width comes from the arguments
            widest = max([widest] + [v for v in values if isinstance(v, int)])
    return len(fmt) + len(fields) * widest


def replace_size(s: str, old: str, new: str, count: int | None) -> int:
    if len(new) <= len(old):
        return len(s)
    times = s.count(old) if old else len(s) + 1
    if count is not None and count >= 0:
        times = min(times, count)
    return len(s) + times * (len(new) - len(old))


def json_size(compact: str, value: Any, indent: int | str | None) -> int:
    """An upper estimate of ``json.dumps(value, indent=indent)`` from its compact form: a line per item, indented."""
    if indent is None:
        return len(compact)
    step = len(indent) if isinstance(indent, str) else max(indent, 0)
    lines = compact.count(",") + compact.count("[") + compact.count("{") + 1
    return len(compact) + lines * (_depth(value) * step + 1)


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, (list, tuple)):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def join_size(separator: str, items: list[Any]) -> int:
    return sum(text_length(item) for item in items) + len(separator) * max(len(items) - 1, 0)


def str_method_size(method: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """An upper estimate of what a bound ``str`` method builds; 0 for methods that cannot grow their string."""
    s, name = method.__self__, method.__name__
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        return max(len(s), args[0])
    if name == "expandtabs":
        tabsize = args[0] if args else kwargs.get("tabsize", 8)
        return len(s) + s.count("\t") * max(tabsize, 0) if isinstance(tabsize, int) else 0
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        count = args[2] if len(args) > 2 else kwargs.get("count")
        return replace_size(s, args[0], args[1], count if isinstance(count, int) else None)
    return 0
