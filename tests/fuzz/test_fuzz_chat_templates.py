"""Property-based: any chat template renders a conversation, or is a ``TemplateError``, within a bound.

Templates come from a small grammar of what Hub templates are made of: text, ``{{ }}``
expressions, ``for`` loops over the messages, over ``range(n)`` (with ``loop`` variables,
``break``/``continue`` and an ``else``), ``if``/``elif``/``else``, ``set`` (plain, into a
``namespace``, and block ``set``), ``macro`` and ``call`` (a macro calling itself, with or
without a base case), ``raise_exception``, and expressions of string operations
(concatenation, ``~``, repetition by small and huge counts, slicing, ``replace``,
``split``, ``format``, ``%``), arithmetic (``**`` included), comparisons, tests (``is
defined``, ``is string``), filters (``tojson`` with its options, ``length``, ``join``,
``trim``, ``upper``, ``reverse``, ``unique``, ``map``, ``selectattr``, ``batch``, ``sum``, ...),
attribute and item access (private names included, which the sandbox refuses), and
undefined names. Messages are drawn too: roles, text of any Unicode, content that is a
list of parts, a number or missing, extra keys.

Each case is rendered through ``specformer_text.chat_template.render`` in a worker
process (its address space capped at :data:`WORKER_MEMORY`), so that a template that runs
away is stopped by a watchdog after :data:`RENDER_LIMIT_S` seconds instead of hanging the
run. Invariant: a rendered string or a ``TemplateError`` with a message; no other
exception (``RecursionError``, ``OverflowError``, ``MemoryError``, ...) and no case past
the bound.
"""

from __future__ import annotations

import multiprocessing
import resource
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Iterator

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from fuzz.harness import FAST, SLOW

#: Seconds a render may take: a template of this grammar renders in milliseconds unless it runs away.
RENDER_LIMIT_S = 2
#: The worker's address space: a runaway allocation ends in the worker, not on the machine.
WORKER_MEMORY = 4 << 30
FAST_TEMPLATES = settings(FAST, max_examples=40)

ROLES = ["system", "user", "assistant", "tool", "", "USER", "a\u0301"]
TEXTS = st.one_of(st.sampled_from(["hi", "", " ", "{{ x }}", "{% if %}", "<|im_end|>", "\u202e", "\x00", "a" * 300]),
                  st.text(max_size=20))
contents = st.one_of(TEXTS, TEXTS, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXTS}), max_size=2),
                     st.integers(), st.none(), st.floats())


@st.composite
def messages(draw: Any) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(0, 4))):
        message: dict[str, Any] = {"role": draw(st.sampled_from(ROLES))}
        if draw(st.integers(0, 6)):
            message["content"] = draw(contents)
        if draw(st.integers(0, 5)) == 5:
            message[draw(st.sampled_from(["name", "tool_calls", "_private", "x"]))] = draw(TEXTS)
        out.append(message)
    return out


NAMES = ["messages", "message", "m", "x", "ns", "loop", "add_generation_prompt", "bos_token", "eos_token", "tools",
         "undefined_name", "i"]
HUGE = ["10", "100000", "99999999", "2**31", "10**10", "10**100", "-1", "0"]
FILTERS = ["length", "upper", "lower", "trim", "title", "reverse", "first", "last", "unique", "list", "string", "int",
           "float", "abs", "sum", "min", "max", "sort", "join", "join(', ')", "tojson", "tojson(indent=2)",
           "tojson(indent=-1)", "tojson(sort_keys=true)", "map(attribute='role')", "selectattr('role', 'equalto', 'user')",
           "rejectattr('content')", "batch(2)", "batch(0)", "slice(3)", "default('d')", "replace('a', 'bb')",
           "truncate(5)", "wordwrap(3)", "center(100000)", "indent(4)", "format(1)", "round", "items", "dictsort",
           "count", "safe", "e", "attr('__class__')", "string|length"]

SUBSCRIPTS = ["0", "-1", "1:", "::-1", "'role'", "'content'", "99", "x"]
ATTRIBUTES = ["role", "content", "upper()", "split()", "strip()", "items()", "__class__", "_x", "mro",
              "replace('a', 'b')", "format(1, 2)"]
COMPARISONS = ["==", "!=", "<", "in", "not in", "and", "or"]
TESTS = ["is defined", "is string", "is none", "is iterable", "is not mapping"]


@st.composite
def expressions(draw: Any, depth: int = 0) -> str:
    """A Jinja expression: names, literals, string and number operations, filters, calls, access."""
    if depth > 2:
        return draw(st.sampled_from(["'a'", "1", "x", "message['content']", "messages", "none", "true"]))
    sub = lambda: draw(expressions(depth + 1))  # noqa: E731 - a drawn sub-expression, read like a grammar rule
    form = draw(st.integers(0, 17))
    if form == 0:
        return draw(st.sampled_from(NAMES))
    if form == 1:
        return repr(draw(st.text(max_size=6)))
    if form == 2:
        return draw(st.sampled_from(["0", "1", "-3", "2.5", "1e308", "none", "true", "[]", "{}", "[1, 'a']",
                                     "{'role': 'user'}"]))
    if form == 3:
        return f"({sub()} {draw(st.sampled_from(['+', '~', '-', '*', '/', '//', '%', '**']))} {sub()})"
    if form == 4:  # repetition, the usual way a template makes a long string
        return f"({sub()} * {draw(st.sampled_from(HUGE))})"
    if form == 5:
        return f"({sub()} | {draw(st.sampled_from(FILTERS))})"
    if form == 6:
        return f"{sub()}[{draw(st.sampled_from(SUBSCRIPTS))}]"
    if form == 7:
        return f"{sub()}.{draw(st.sampled_from(ATTRIBUTES))}"
    if form == 8:
        if draw(st.booleans()):
            return f"({sub()} {draw(st.sampled_from(COMPARISONS))} {sub()})"
        return f"({sub()} {draw(st.sampled_from(TESTS))})"
    if form == 9:
        return f"range({draw(st.sampled_from(HUGE))})"
    if form == 10:
        return f"({sub()} if {sub()} else {sub()})"
    if form == 11:
        return f"namespace(a={sub()})"
    if form == 12:
        return f"raise_exception({sub()})"
    if form == 13:
        return f"({sub()} % {sub()})"
    if form == 14:
        return f"{sub()}.format({sub()})" if draw(st.booleans()) else f"'%s' % {sub()}"
    if form == 15:
        return f"strftime_now({sub()})"
    if form == 16:
        return f"loop.{draw(st.sampled_from(['index', 'index0', 'first', 'last', 'length', 'previtem', 'cycle(1, 2)']))}"
    return f"self.{draw(st.sampled_from(['m', 'block', '__init__']))}()" if draw(st.booleans()) else f"m({sub()})"


@st.composite
def statements(draw: Any, depth: int = 0) -> str:
    """A piece of template: text, an output, or a block statement holding more pieces."""
    body = lambda: "".join(draw(st.lists(statements(depth + 1), max_size=3)))  # noqa: E731
    expr = lambda: draw(expressions())  # noqa: E731
    form = draw(st.integers(0, 13 if depth < 3 else 1))
    if form == 0:
        return draw(st.sampled_from(["text ", "\n", "  ", "<s>", "{#c#}", "{{ '{{' }}", "{% raw %}{{ x }}{% endraw %}"]))
    if form == 1:
        return f"{{{{ {expr()} }}}}"
    if form == 2:
        return f"{{% for message in messages %}}{body()}{{% endfor %}}"
    if form == 3:
        over = draw(st.sampled_from(["messages", f"range({draw(st.sampled_from(HUGE))})", "messages|reverse",
                                     "messages[1:]", "x", "'abc'", "messages|batch(2)", "message['content']"]))
        tail = draw(st.sampled_from(["", "{% else %}empty", "{% if loop.index > 2 %}{% break %}{% endif %}",
                                     "{% continue %}"]))
        return f"{{% for x in {over} %}}{body()}{tail}{{% endfor %}}"
    if form == 4:
        branches = f"{{% elif {expr()} %}}{body()}" if draw(st.booleans()) else ""
        return f"{{% if {expr()} %}}{body()}{branches}{{% else %}}{body()}{{% endif %}}"
    if form == 5:
        return f"{{% set x = {expr()} %}}"
    if form == 6:
        return f"{{% set ns = namespace(a={expr()}) %}}{{% set ns.a = {expr()} %}}{{{{ ns.a }}}}"
    if form == 7:
        return f"{{% set x %}}{body()}{{% endset %}}{{{{ x }}}}"
    if form == 8:  # a macro, maybe calling itself with or without a base case
        call = draw(st.sampled_from(["m(n - 1)", "m(n)", "m(n + 1) ~ m(n + 1)", "n"]))
        guard = draw(st.sampled_from(["n > 0", "true", "n < 10", "false"]))
        start = draw(st.sampled_from(["3", "10", "1000", "100000"]))
        return f"{{% macro m(n) %}}{{% if {guard} %}}{{{{ {call} }}}}{{% endif %}}{body()}{{% endmacro %}}{{{{ m({start}) }}}}"
    if form == 9:
        return f"{{% macro w() %}}[{{{{ caller() }}}}]{{% endmacro %}}{{% call w() %}}{body()}{{% endcall %}}"
    if form == 10:
        return f"{{% if {expr()} %}}{{{{ raise_exception({expr()}) }}}}{{% endif %}}"
    if form == 11:
        return f"{{% generation %}}{body()}{{% endgeneration %}}"
    if form == 12:
        return f"{{% filter upper %}}{body()}{{% endfilter %}}"
    return draw(st.sampled_from(["{% if %}", "{{", "{% for x in %}", "{% endfor %}", "{{ x | nofilter }}", "{% macro %}"]))


@st.composite
def templates(draw: Any) -> str:
    return "".join(draw(st.lists(statements(), min_size=1, max_size=4)))


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))


def _render(template: str, conversation: list[dict[str, Any]], add_generation_prompt: bool) -> tuple[str, str]:
    """In the worker: (how the render ended, a short description)."""
    from specformer_text.chat_template import TemplateError, render

    try:
        text = render(template, conversation, add_generation_prompt=add_generation_prompt, bos_token="<s>",
                      eos_token="</s>")
    except TemplateError as exc:
        return ("TemplateError", str(exc)[:200]) if str(exc).strip() else ("TemplateError without a message", "")
    except BaseException as exc:  # noqa: BLE001 - the very thing this target looks for
        return type(exc).__name__, str(exc)[:200]
    return ("rendered", f"{len(text)} characters") if isinstance(text, str) else (type(text).__name__, "not a string")


class Renderer:
    """A worker process to render in, replaced when a render runs past the bound or kills it."""

    def __init__(self) -> None:
        self._pool = self._start()

    @staticmethod
    def _start() -> ProcessPoolExecutor:
        # spawn, not fork: the test process holds torch's threads, which a forked child must not inherit.
        pool = ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_limit_memory)
        # The worker's imports (specformer, torch) take seconds: done here, outside any case's bound.
        assert pool.submit(_render, "{{ 1 }}", [], False).result(timeout=300) == ("rendered", "1 characters")
        return pool

    def __call__(self, template: str, conversation: list[dict[str, Any]], add_generation_prompt: bool) -> tuple[str, str]:
        future = self._pool.submit(_render, template, conversation, add_generation_prompt)
        try:
            return future.result(timeout=RENDER_LIMIT_S)
        except FutureTimeout:
            self._restart()
            return "ran past the bound", f"more than {RENDER_LIMIT_S} s"
        except BrokenProcessPool:
            self._restart()
            return "killed the worker", ""

    def _restart(self) -> None:
        for process in list(getattr(self._pool, "_processes", {}).values()):
            process.kill()  # only the pool's own worker, started above
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._pool = self._start()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.fixture(scope="module")
def renderer() -> Iterator[Renderer]:
    worker = Renderer()
    yield worker
    worker.close()


def _case(renderer: Renderer, template: str, conversation: list[dict[str, Any]], add_generation_prompt: bool) -> None:
    ended, detail = renderer(template, conversation, add_generation_prompt)
    event(ended)
    assert ended in ("rendered", "TemplateError"), f"{ended}: {detail}\ntemplate: {template!r}"


@FAST_TEMPLATES
@given(template=templates(), conversation=messages(), add_generation_prompt=st.booleans())
@example(template="{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}", conversation=[
    {"role": "user", "content": "hi"}], add_generation_prompt=True)
@example(template="{{ raise_exception('no system role') }}", conversation=[], add_generation_prompt=False)
@example(template="{{ ''.__class__ }}{{ ns._x }}", conversation=[], add_generation_prompt=False)
@example(template="{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}", conversation=[],
         add_generation_prompt=False)  # unbounded recursion: RecursionError
@example(template="{{ 'ab' * 10**10 }}", conversation=[], add_generation_prompt=False)  # 20 GB string
@example(template="{{ 2 ** (10 ** 9) }}", conversation=[], add_generation_prompt=False)  # a billion-bit power: seconds of arithmetic
@example(template="{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}", conversation=[],
         add_generation_prompt=False)  # ten billion steps
def test_any_chat_template(renderer, template, conversation, add_generation_prompt):
    _case(renderer, template, conversation, add_generation_prompt)


@pytest.mark.slow
@SLOW
@given(template=templates(), conversation=messages(), add_generation_prompt=st.booleans())
def test_any_chat_template_many(renderer, template, conversation, add_generation_prompt):
    _case(renderer, template, conversation, add_generation_prompt)
