"""The ``specformer generate`` command a finished run suggests, one that works as printed.

It continues the spec's own ``train.sample_prompt`` (what the run's samples showed),
quoted for a POSIX shell, and asks for no more new tokens than the model's context
leaves after the prompt.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from specformer.tokenizer import Tokenizer

#: The prompt when the spec has no ``sample_prompt`` (samples then start from a document start).
FALLBACK_PROMPT = "The"
#: Most new tokens the hint asks for: enough to see what the model learnt.
HINT_NEW_TOKENS = 100


def generate_command(model_path: Path, *, prompt: str, tokenizer: Tokenizer, context_length: int,
                     max_new_tokens: int = HINT_NEW_TOKENS) -> str:
    """``specformer generate MODEL --prompt '...' --max-new-tokens N`` with N within the context."""
    prompt = prompt or FALLBACK_PROMPT
    ids = tokenizer.encode(prompt)
    if not ids or len(ids) >= context_length:
        prompt, ids = FALLBACK_PROMPT, tokenizer.encode(FALLBACK_PROMPT)
    budget = max(1, min(max_new_tokens, context_length - len(ids)))
    return (f"specformer generate {shlex.quote(str(model_path))} --prompt {shlex.quote(prompt)} "
            f"--max-new-tokens {budget}")
