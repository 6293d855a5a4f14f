"""Which chat template turns a chat request's messages into the prompt text, and rendering it.

The template, first found of: ``--chat-template`` (a file, or a built-in name such as
``chatml``), the checkpoint's own (an imported model's ``tokenizer_config.json``, kept in
its header), else :data:`PLAIN` (one ``role: content`` line per message, then
``assistant:``), for a model trained on plain text. Rendering is the fine-tuning plugin's
(:mod:`specformer_finetune.chat_template`: transformers' ``apply_chat_template``
semantics, sandboxed), so a model is served with the very text it was fine-tuned on;
the generation prompt is always added.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from specformer.errors import UserError
from specformer_finetune.chat_template import BUILTIN, TemplateError, compile_template, render, \
    template_from_metadata

#: The template used when neither the command line nor the checkpoint gives one.
PLAIN = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")

Renderer = Callable[[list[dict[str, Any]]], str]

__all__ = ["PLAIN", "Renderer", "TemplateError", "chat_renderer", "renderer_for"]


def renderer_for(source: str, tokens: dict[str, str] | None = None) -> Renderer:
    """Messages -> prompt text under the template ``source`` (TemplateError, a UserError, if it does not compile)."""
    compile_template(source)  # fail now, at start-up, not on the first request
    extra = dict(tokens or {})

    def render_messages(messages: list[dict[str, Any]]) -> str:
        return render(source, messages, add_generation_prompt=True, **extra)

    return render_messages


def chat_renderer(choice: str | None, metadata: dict[str, str]) -> tuple[Renderer, str]:
    """The renderer for ``--chat-template`` ``choice`` and a checkpoint's header; and where its template came from."""
    found = template_from_metadata(metadata)
    tokens = found[1] if found is not None else {}
    if choice is None:
        if found is not None:
            return renderer_for(found[0], tokens), "the checkpoint's chat template"
        return renderer_for(PLAIN), "the plain 'role: content' template"
    if choice in BUILTIN:
        return renderer_for(BUILTIN[choice], tokens), f"the built-in {choice!r} template"
    try:
        source = Path(choice).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"--chat-template {choice!r} is neither a built-in template ({', '.join(BUILTIN)}) nor a "
                        f"readable file ({exc})") from None
    try:
        return renderer_for(source, tokens), choice
    except TemplateError as exc:
        raise UserError(f"--chat-template {choice}: {exc}") from None
