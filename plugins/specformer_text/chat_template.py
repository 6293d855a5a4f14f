"""Chat templates: Jinja templates rendered with the semantics of transformers' ``apply_chat_template``.

An imported model's ``tokenizer_config.json`` (stored in its checkpoint header as
``hf.tokenizer_config``) usually holds a ``chat_template``: a Jinja program that turns a
list of ``{"role", "content"}`` messages into the text the model was trained on. It is
run here the way transformers runs it, so the text is the same character for character:

- a sandboxed, immutable Jinja environment (templates from the Hub are untrusted code);
  namespaces refuse underscore-prefixed attributes;
- ``trim_blocks`` and ``lstrip_blocks`` (a block tag's newline and indentation vanish),
  and the ``loopcontrols`` extension (``{% break %}``, ``{% continue %}``);
- ``tojson`` as ``json.dumps`` (no HTML escaping; ``indent``, ``separators``,
  ``sort_keys`` and ``ensure_ascii`` accepted), ``raise_exception(message)`` and
  ``strftime_now(format)``; ``{% generation %}`` blocks render their body;
- the variables ``messages``, ``add_generation_prompt``, ``tools``, ``documents`` and the
  tokenizer's special tokens (``bos_token``, ``eos_token``, ...).

Unlike transformers, rendering is bounded (:mod:`.template_bounds`): by default a template
may run for 1 s and produce 1 MiB (1,048,576 characters), and no value it builds may be
larger. A template that fails, recurses too deep, overflows or runs past a bound raises
one :class:`TemplateError` naming the template as the cause and the bound it hit.

``specformer_text.render(template, messages, add_generation_prompt=True)`` is what the
plugins that talk to a chat model (fine-tuning, generate, chat, serve) call.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from specformer.errors import UserError

from specformer_text.header_keys import TOKENIZER_CONFIG_KEY
from specformer_text.template_bounds import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT, BoundExceeded, Bounds, json_size, \
    refuse_over, render_bounded

#: Templates a spec can name instead of a file (``train.chat_template: chatml``).
BUILTIN = {
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    ),
}
#: The special-token names transformers passes to a template (from its special tokens map).
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class TemplateError(UserError):
    """A chat template failed to compile or render (``raise_exception`` included); the message says why."""


@lru_cache(maxsize=16)
def compile_template(source: str) -> Any:
    # late: jinja2 is an optional dependency (the serve extra); importing this module must not need it
    import jinja2
    import jinja2.ext

    from specformer_text.template_sandbox import BoundedSandbox, bound_tilde  # late: imports jinja2

    class GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers marks the assistant's text with it; the body renders."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class SafeNamespace(jinja2.utils.Namespace):
        """``namespace(...)`` whose attributes cannot be underscore-prefixed (no path to CPython internals)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's own signature trick
            self, rest = args[0], args[1:]
            values = dict(*rest, **kwargs)
            for key in values:
                _refuse_private(key)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, key: str, value: Any) -> None:
            _refuse_private(key)
            jinja2.utils.Namespace.__setitem__(self, key, value)

    def _refuse_private(key: Any) -> None:
        if isinstance(key, str) and key.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a chat template may not set the attribute {key!r} on a namespace")

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        compact = json.dumps(value, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys)
        refuse_over(json_size(compact, value, indent), "a string with tojson")
        if indent is None:
            return compact
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, namespace=SafeNamespace)
    try:
        return bound_tilde(env.from_string(source))
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise TemplateError(f"the chat template does not compile: {exc.message} (line {exc.lineno})") from None
    except (RecursionError, MemoryError) as exc:  # nesting deep enough to overflow the parser
        raise TemplateError(f"the chat template does not compile: {_python_error(exc)}") from None


def render(template: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False,
           tools: list[dict[str, Any]] | None = None, documents: list[dict[str, Any]] | None = None,
           timeout: float = DEFAULT_TIMEOUT, max_output: int = DEFAULT_MAX_OUTPUT, **extra: Any) -> str:
    """The text of ``messages`` under ``template`` (its source); ``extra`` are more variables (special tokens).

    The template may run for ``timeout`` seconds and produce ``max_output`` characters (no
    value it builds may be larger either); past either, or on any failure, TemplateError.
    """
    import jinja2  # late: an optional dependency, as in compile_template

    try:
        bounds = Bounds(timeout=timeout, max_output=max_output)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    compiled = compile_template(template)
    variables = dict(messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
                     documents=documents, **extra)
    try:
        return render_bounded(compiled, variables, bounds=bounds)
    except BoundExceeded as exc:
        raise TemplateError(f"the chat template {exc}") from None
    except jinja2.exceptions.TemplateError as exc:
        raise TemplateError(f"the chat template refused the conversation: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - the template is code: whatever it raises is its failure
        raise TemplateError(f"the chat template failed: {_python_error(exc)}") from None


def _checkpoint_template(path: Path, *, what: str) -> tuple[str, dict[str, str]]:
    from specformer.checkpoint.save_load import read_metadata  # late: imports torch; naming a template must not

    found = template_from_metadata(read_metadata(path))
    if found is None:
        raise UserError(f"{what}: the checkpoint {path} has no chat template in its header (only an imported model "
                        "keeps one); give a template file or a built-in name")
    return found


def _python_error(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "it recursed too deeply (a macro that calls itself without end?)"
    if isinstance(exc, MemoryError):
        return "it ran out of memory"
    return f"{type(exc).__name__}: {exc}"


def special_tokens(settings: dict[str, Any] | None) -> dict[str, str]:
    """The special tokens of a tokenizer_config.json, as strings (older configs store ``{"content": ...}``)."""
    out: dict[str, str] = {}
    for name in SPECIAL_TOKENS:
        value = (settings or {}).get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


def template_from_metadata(metadata: dict[str, str]) -> tuple[str, dict[str, str]] | None:
    """A checkpoint's chat template and special tokens (hf import stores tokenizer_config.json); None without one."""
    try:
        settings = json.loads(metadata.get(TOKENIZER_CONFIG_KEY) or "null")
    except (json.JSONDecodeError, RecursionError):
        return None
    if not isinstance(settings, dict):
        return None
    template = settings.get("chat_template")
    if isinstance(template, list):  # several named templates: transformers uses "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return (template, special_tokens(settings)) if isinstance(template, str) else None


def resolve_template(choice: str | None, metadata: dict[str, str] | None, *,
                     what: str = "train.chat_template") -> tuple[str, dict[str, str]] | None:
    """``choice`` (a built-in name, a Jinja file, or a ``.safetensors`` checkpoint whose header holds a
    template), else the checkpoint's own template (``metadata``'s), else None.

    ``what`` names the setting in a UserError (``train.chat_template``, ``--chat-template``);
    a file's template is compiled here, so a broken one fails before anything else runs.
    """
    tokens = special_tokens(None)
    found = template_from_metadata(metadata or {})
    if found is not None:
        tokens = found[1]
    if choice is None:
        return found
    if choice in BUILTIN:
        return BUILTIN[choice], tokens
    path = Path(choice)
    if not path.is_file():
        raise UserError(f"{what}: {choice!r} is neither a built-in template ({', '.join(BUILTIN)}) nor "
                        "a readable file")
    if path.suffix == ".safetensors":  # another checkpoint's own template (a full fine-tune's base)
        return _checkpoint_template(path, what=what)
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{what}: {choice}: cannot be read ({exc})") from None
    try:
        compile_template(source)
    except TemplateError as exc:
        raise TemplateError(f"{what} {choice}: {exc}") from None
    return source, tokens
