"""A hostile chat template is stopped by its time and size bounds with one TemplateError; a normal one renders as before."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from specformer.errors import UserError
from specformer_text.chat_template import BUILTIN, TemplateError, render

HI = [{"role": "user", "content": "hi"}]
BIG = "{% set b = 'a' * 1000000 %}"

#: (template, words the error must hold): each would take minutes or gigabytes without the bounds.
HOSTILE = {
    "nested loops, no output": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                                "time bound of 0.2 s"),
    "nested loops, output": ("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
                             "time bound of 0.2 s"),
    "lipsum": ("{{ lipsum(n=10**9)|length }}", "time bound of 0.2 s"),
    "recursive macro": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "range over the sandbox's limit": ("{{ range(10**9)|list }}", "OverflowError"),
    "string times": ("{{ 'a' * 10**9 }}", "with '*'"),
    "list times": ("{{ ([1] * 10**9)|length }}", "with '*'"),
    "power": ("{{ 10 ** (10 ** 9) }}", "with '**'"),
    "float power": ("{{ 10.0 ** 400 }}", "OverflowError"),
    "printf width": ("{{ '%0999999999d' % 1 }}", "with '%'"),
    "printf star width": ("{{ '%*d' % (999999999, 1) }}", "with '%'"),
    "printf many fields": (BIG + "{{ ('%(a)s' * 100000) % {'a': b} }}", "with '%'"),
    "doubling with +": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                        "{% endfor %}", "with '+'"),
    "doubling with ~": ("{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}", "with '~'"),
    "str.center": ("{{ 'a'.center(10**9) }}", "with center"),
    "str.ljust": ("{{ 'a'.ljust(10**9)|length }}", "with ljust"),
    "str.expandtabs": ("{{ ('\t' * 1000000).expandtabs(100000)|length }}", "with expandtabs"),
    "str.replace": ("{% set b = 'a' * 100000 %}{{ b.replace('a', b)|length }}", "with replace"),
    "str.join": (BIG + "{{ b.join(['x'] * 1000)|length }}", "with join"),
    "str.format width": ("{{ '{:>999999999}'.format(1) }}", "with format"),
    "str.format nested width": ("{{ '{:{}}'.format(1, 999999999) }}", "with format"),
    "center filter": ("{{ 'a'|center(10**9) }}", "with center"),
    "format filter": ("{{ '%0999999999d'|format(1) }}", "with format"),
    "join filter": (BIG + "{{ ([b] * 1000)|join|length }}", "with join"),
    "replace filter": ("{% set b = 'a' * 100000 %}{{ b|replace('a', b)|length }}", "with replace"),
    "indent filter": ("{{ ('a\n' * 100000)|indent(100000)|length }}", "with indent"),
    "batch filter": ("{{ [1]|batch(10**9, 0)|list|length }}", "a batch"),
    "sum filter": ("{% set b = [1] * 1000000 %}{{ ([b] * 1000)|sum(start=[])|length }}", "with sum"),
    "tojson indent": ("{{ messages|tojson(indent=10**9) }}", "with tojson"),
    "tojson indent, constant": ("{{ [1, 2]|tojson(indent=10**9) }}", "with tojson"),
    "set block": (BIG + "{% set x %}{% for i in range(1000) %}{{ b }}{% endfor %}{% endset %}{{ x|length }}",
                  "block's or a macro's text"),
    "macro": (BIG + "{% macro m() %}{% for i in range(1000) %}{{ b }}{% endfor %}{% endmacro %}{{ m()|length }}",
              "block's or a macro's text"),
    "output": ("{% for i in range(100000) %}{{ 'a' * 100 }}{% endfor %}", "output bound of 1,048,576"),
    "huge int as text": ("{{ (10 ** 5000)|string }}", "ValueError"),
    "type error": ("{{ 1 + 'a' }}", "TypeError"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_is_one_template_error_naming_the_bound(name: str) -> None:
    template, words = HOSTILE[name]
    # Short where the time bound is the point; generous elsewhere, so that a loaded machine hits the intended bound.
    with pytest.raises(TemplateError) as caught:
        render(template, HI, timeout=0.2 if "time bound" in words else 10)
    message = str(caught.value)
    assert message.startswith("the chat template ") and words in message, message
    assert "\n" not in message


def test_the_bounds_are_parameters() -> None:
    slow = "{% for i in range(3000) %}{% for j in range(100) %}{% endfor %}{% endfor %}done"
    assert render(slow, HI, timeout=60) == "done"
    with pytest.raises(TemplateError, match="time bound of 0.001 s"):
        render(slow, HI, timeout=0.001)
    long = "{{ 'a' * 2000 }}"
    assert render(long, HI, max_output=2000) == "a" * 2000
    with pytest.raises(TemplateError, match="size bound of 1,999"):
        render(long, HI, max_output=1999)
    with pytest.raises(TemplateError, match="output bound of 1,999"):
        render("{% for i in range(2000) %}a{% endfor %}", HI, max_output=1999)
    with pytest.raises(UserError, match="above 0 seconds"):
        render(long, HI, timeout=0)


def test_a_value_folded_at_compile_time_is_bounded_by_the_render_that_uses_it() -> None:
    # Jinja evaluates constant filter calls while compiling; a large one is left to the render's own bounds.
    template = "{{ 'a'|center(2000000)|length }}"
    with pytest.raises(TemplateError, match="with center"):
        render(template, HI)
    assert render(template, HI, max_output=3_000_000) == "2000000"


def test_rendering_leaves_the_threads_tracer_as_it_was() -> None:
    def tracer(frame, event, arg):  # a stand-in for a debugger's or coverage's tracer
        return None

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        render(BUILTIN["chatml"], HI)
        with pytest.raises(TemplateError):
            render(HOSTILE["nested loops, no output"][0], HI, timeout=0.05)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(previous)


def test_a_template_past_its_deadline_leaves_no_work_running() -> None:
    """The render stops in its own thread: once render() has raised, nothing of the template is still running."""
    counted = []

    def render_in_thread() -> None:
        try:
            render("{% for i in range(100000) %}{% for j in range(100000) %}{{ count() }}{% endfor %}{% endfor %}",
                   HI, timeout=0.1, max_output=10**9, count=lambda: counted.append(1) or "")
        except TemplateError:
            pass

    worker = threading.Thread(target=render_in_thread)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive()
    settled = len(counted)
    time.sleep(0.2)
    assert len(counted) == settled > 0


def test_normal_templates_render_unchanged_under_the_bounds() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U" * 500_000}]
    expected = "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\n" + "U" * 500_000 + "<|im_end|>\n"
    assert render(BUILTIN["chatml"], messages) == expected
    assert render("{{ '%s-%05d' % ('a', 7) }} {{ '{:>4}'.format('b') }} {{ ['x', 'y']|join(', ') }}"
                  "{{ 'c'|center(5) }}|{{ messages|tojson(indent=2)|length > 0 }}", HI) == "a-00007    b x, y  c  |True"
