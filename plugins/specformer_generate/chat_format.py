"""Which chat template ``generate`` and ``chat`` apply, and where the model's turn ends under it.

The template, first found of: ``--no-chat-template`` (none: plain text), ``--chat-template
NAME|FILE`` (a built-in name such as ``chatml``, or a Jinja file), the checkpoint's own (an
imported model's tokenizer_config.json, kept in its header), else none. Rendering and the
end of a turn are the text services' (:mod:`specformer_text.chat_template`,
:mod:`specformer_text.end_of_turn`), the same code that rendered the model's training
conversations and that ``specformer serve`` uses. With ``--ids`` (token ids in and out) no template applies unless
one is asked for, which is then an error: a template renders text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_text import TurnEnd, render, resolve_template, turn_end


@dataclass(frozen=True)
class ChatFormat:
    """A chat template in use: its ``source``, the special tokens it may name, where a reply ends, and ``where``
    it came from (for messages)."""

    source: str
    tokens: dict[str, str]
    turn_end: TurnEnd
    where: str

    def prompt(self, messages: list[dict[str, Any]]) -> str:
        """The text of ``messages`` with the assistant's turn opened (the generation prompt); TemplateError if
        the template fails (a UserError: exit 2)."""
        return render(self.source, messages, add_generation_prompt=True, **self.tokens)


def chat_format(args: Any, metadata: dict[str, str], tokenizer: Any) -> ChatFormat | None:
    """The template ``args`` (``--chat-template``, ``--no-chat-template``, ``--ids``) and the checkpoint choose."""
    choice = getattr(args, "chat_template", None)
    if choice is not None and getattr(args, "no_chat_template", False):
        raise UserError("--chat-template and --no-chat-template contradict each other; give one of them")
    if getattr(args, "no_chat_template", False):
        return None
    if getattr(args, "ids", False):
        if choice is not None:
            raise UserError("--chat-template renders text, and --ids gives token ids; drop one of them")
        return None
    found = resolve_template(choice, metadata, what="--chat-template")
    if found is None:
        return None
    source, tokens = found
    where = f"--chat-template {choice}" if choice is not None else "the checkpoint's chat template"
    return ChatFormat(source=source, tokens=tokens, where=where,
                      turn_end=turn_end(source, tokenizer=tokenizer, metadata=metadata))
