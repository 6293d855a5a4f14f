"""Which chat template turns a chat request's messages into the prompt text, and rendering it.

The template, first found of: ``--chat-template`` (a file, a built-in name such as
``chatml``, or another checkpoint whose header holds one), the checkpoint's own (an imported model's ``tokenizer_config.json``, kept in
its header), else :data:`PLAIN` (one ``role: content`` line per message, then
``assistant:``), for a model trained on plain text. Rendering is the text services'
(:mod:`specformer_text.chat_template`: transformers' ``apply_chat_template``
semantics, sandboxed), so a model is served with the very text it was fine-tuned on;
the generation prompt is always added. Rendering is bounded in time and output
(``--chat-template-timeout``, ``--chat-template-max-chars``); a template past a bound, or
failing, raises TemplateError, which the server answers with a 400.

The chosen template also says where the model's reply ends (:func:`ServedTemplate.turn_end`,
from :mod:`specformer_text.end_of_turn`): its end marker (``<|im_end|>`` for ChatML), the
tokenizer_config's ``eos_token`` and the generation_config's ``eos_token_id``; a chat
choice stops there with ``finish_reason: stop`` and the marker is not part of its text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from specformer_text import DEFAULT_MAX_OUTPUT, DEFAULT_TIMEOUT, BUILTIN, TemplateError, TurnEnd, \
    compile_template, render, resolve_template, turn_end

#: The template used when neither the command line nor the checkpoint gives one.
PLAIN = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}assistant:{% endif %}")

Renderer = Callable[[list[dict[str, Any]]], str]

__all__ = ["PLAIN", "Renderer", "ServedTemplate", "TemplateError", "TurnEnd", "chat_renderer", "renderer_for"]


@dataclass(frozen=True)
class ServedTemplate:
    """The chat template a server renders with: ``render`` (messages -> prompt text), ``where`` it came from
    (for the start-up line), and its ``source``."""

    render: Renderer
    where: str
    source: str

    def turn_end(self, tokenizer: Any, metadata: dict[str, str]) -> TurnEnd:
        """What ends a reply under this template for ``tokenizer`` and the checkpoint's header."""
        return turn_end(self.source, tokenizer=tokenizer, metadata=metadata)


def renderer_for(source: str, tokens: dict[str, str] | None = None, *, timeout: float = DEFAULT_TIMEOUT,
                 max_output: int = DEFAULT_MAX_OUTPUT) -> Renderer:
    """Messages -> prompt text under the template ``source``, within ``timeout`` seconds and ``max_output`` characters.

    TemplateError (a UserError) now if the template does not compile, on a call if it fails.
    """
    compile_template(source)  # fail now, at start-up, not on the first request
    extra = dict(tokens or {})

    def render_messages(messages: list[dict[str, Any]]) -> str:
        return render(source, messages, add_generation_prompt=True, timeout=timeout, max_output=max_output, **extra)

    return render_messages


def chat_renderer(choice: str | None, metadata: dict[str, str], *, timeout: float = DEFAULT_TIMEOUT,
                  max_output: int = DEFAULT_MAX_OUTPUT) -> ServedTemplate:
    """The template for ``--chat-template`` ``choice`` and a checkpoint's header, ready to render.

    ``choice`` is read as ``generate`` and ``chat`` read it (a built-in name, a Jinja file, or a
    checkpoint whose header holds a template: :func:`~specformer_finetune.resolve_template`).
    """
    bounds = {"timeout": timeout, "max_output": max_output}
    found = resolve_template(choice, metadata, what="--chat-template")
    if found is None:
        return ServedTemplate(renderer_for(PLAIN, **bounds), "the plain 'role: content' template", PLAIN)
    source, tokens = found
    where = ("the checkpoint's chat template" if choice is None else
             f"the built-in {choice!r} template" if choice in BUILTIN else choice)
    return ServedTemplate(renderer_for(source, tokens, **bounds), where, source)
