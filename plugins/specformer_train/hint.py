"""The ``specformer generate`` command a finished or interrupted run suggests, one that works as printed.

A finished run's names its final model; an interrupted run's names the run directory, which
every command reads as its latest checkpoint (:func:`specformer.checkpoint.locate.resolve_checkpoint`),
after ``specformer checkpoint consolidate`` when that checkpoint is sharded.

It continues the spec's own ``train.sample_prompt`` (what the run's samples showed),
quoted for a POSIX shell, and asks for no more new tokens than the model's context
leaves after the prompt. A chat run (chat data with a template) suggests ``specformer
chat`` instead, with the ``--chat-template`` option that names the run's template when the
model file does not carry it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from specformer.tokenizers.tokenizer import Tokenizer

#: The prompt when the spec has no ``sample_prompt`` (samples then start from a document start).
FALLBACK_PROMPT = "The"
#: Most new tokens the hint asks for: enough to see what the model learnt.
HINT_NEW_TOKENS = 100


def generate_command(model_path: Path, *, prompt: str, tokenizer: Tokenizer, context_length: int,
                     max_new_tokens: int = HINT_NEW_TOKENS, chat: Any = None) -> str:
    """``specformer generate MODEL --prompt '...' --max-new-tokens N`` with N within the context; for a chat run
    (``chat`` has ``option``: the ``--chat-template`` words, or empty) ``specformer chat MODEL ...``."""
    if chat is not None:
        budget = max(1, min(max_new_tokens, context_length // 2))
        option = f" {chat.option}" if chat.option else ""
        return f"specformer chat {shlex.quote(str(model_path))}{option} --max-new-tokens {budget}"
    prompt = prompt or FALLBACK_PROMPT
    ids = tokenizer.encode(prompt)
    if not ids or len(ids) >= context_length:
        prompt, ids = FALLBACK_PROMPT, tokenizer.encode(FALLBACK_PROMPT)
    budget = max(1, min(max_new_tokens, context_length - len(ids)))
    return (f"specformer generate {shlex.quote(str(model_path))} --prompt {shlex.quote(prompt)} "
            f"--max-new-tokens {budget}")


def after_consolidating(checkpoint: Path, command: str) -> str:
    """``command`` run once the sharded ``checkpoint`` has its single file (commands other than training read only that)."""
    return f"specformer checkpoint consolidate {shlex.quote(str(checkpoint))} && {command}"
