"""One prompt run through a model with everything worth drawing kept: what ``specformer inspect`` shows.

The prompt is encoded with the model's tokenizer and run once with the residual stream
and every head's attention captured; the logit lens reads each layer's stream. Results
are plain numpy arrays and strings, ready for the figures and the HTML page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from specformer.errors import UserError
from specformer.tokenizers.tokenizer import Tokenizer

from specformer_eval.capturing import capture
from specformer_eval.lens import lens_agreement, logit_lens
from specformer_eval.perplexity import check_ids


@dataclass(frozen=True)
class Inspection:
    """A prompt's tokens, each layer's attention, and the logit lens over its layers."""

    ids: list[int]
    labels: list[str]  # each token as text, made visible (see token_label)
    attention: np.ndarray  # (n_layers, n_heads, T, T) float32 probabilities
    lens_ids: np.ndarray  # (n_layers + 1, T, k) top-k ids per layer (0 = embeddings) and position
    lens_probs: np.ndarray  # (n_layers + 1, T, k)
    lens_labels: list[list[list[str]]]  # [layer][position][rank] the top-k tokens as text
    current_share: np.ndarray  # (n_layers + 1,) share of positions whose top token is the current token
    next_share: np.ndarray  # (n_layers + 1,) ... is the next input token

    @property
    def n_layers(self) -> int:
        return self.attention.shape[0]

    @property
    def n_heads(self) -> int:
        return self.attention.shape[1]


def token_label(tokenizer: Tokenizer, token: int) -> str:
    """A token as a short visible label: spaces as '·', line breaks as '↵', tabs as '⇥'."""
    text = tokenizer.decode([token])
    if text == "":
        return f"<{token}>"  # a special token, which decodes to nothing
    return text.replace(" ", "·").replace("\n", "↵").replace("\r", "␍").replace("\t", "⇥")


def encode_prompt(tokenizer: Tokenizer, text: str, *, model: Any) -> list[int]:
    """The prompt's ids; UserError when it is empty, longer than the context, or foreign to the model."""
    if not text:
        raise UserError("--prompt is empty; give the text to look at")
    ids = tokenizer.encode(text)
    if not ids:
        raise UserError(f"--prompt {text!r} encodes to no tokens")
    if len(ids) > model.context_length:
        raise UserError(f"--prompt is {len(ids)} tokens long, more than the model's context of "
                        f"{model.context_length}; shorten it")
    check_ids(ids, vocab_size=model.vocab_size, where="--prompt")
    return ids


def inspect_prompt(model: Any, tokenizer: Tokenizer, text: str, *, k: int = 5) -> Inspection:
    """Run ``text`` through ``model`` once and keep its attention and logit lens (see the module doc)."""
    ids = encode_prompt(tokenizer, text, model=model)
    device = next(model.parameters()).device
    input_ids = torch.tensor([ids], device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), capture(model, attention=True) as cap:
            model(input_ids)
        silent = [i for i, a in enumerate(cap.attention) if a is None]
        if silent:
            mixers = sorted({type(model.blocks[i].mixer).__name__ for i in silent})
            raise UserError(f"specformer inspect draws every layer's attention, but layers {_ranges(silent)} "
                            f"({', '.join(mixers)}) have no attention probabilities (a recurrent mixer, or none); "
                            f"for the residual stream of such a model use specformer_eval.capture and logit_lens")
        lens = logit_lens(model, cap, k=min(k, model.vocab_size))
    finally:
        model.train(was_training)
    current, following = lens_agreement(lens, input_ids)
    lens_ids = lens.ids[:, 0].cpu().numpy()  # (L + 1, T, k)
    labels_cache: dict[int, str] = {}

    def label(token: int) -> str:
        if token not in labels_cache:
            labels_cache[token] = token_label(tokenizer, token)
        return labels_cache[token]

    return Inspection(
        ids=ids,
        labels=[label(i) for i in ids],
        attention=torch.stack([a[0] for a in cap.attention]).float().cpu().numpy(),
        lens_ids=lens_ids,
        lens_probs=lens.probs[:, 0].float().cpu().numpy(),
        lens_labels=[[[label(int(t)) for t in position] for position in layer] for layer in lens_ids],
        current_share=current.cpu().numpy(),
        next_share=following.cpu().numpy(),
    )


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 4]`` as ``0-2, 4``."""
    parts: list[str] = []
    start = prev = indices[0]
    for i in indices[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)


def choose_token(inspection: Inspection, choice: str | None) -> int:
    """The position ``--token`` names: an index (negative counts from the end), or a token's text
    (its last occurrence); the last token when None. UserError listing the tokens otherwise."""
    n = len(inspection.ids)
    if choice is None:
        return n - 1
    try:
        index = int(choice)
    except ValueError:
        index = None
    if index is not None:
        if not -n <= index < n:
            raise UserError(f"--token {choice}: the prompt has {n} tokens (positions 0..{n - 1}, or -1..-{n})")
        return index % n
    wanted = choice.replace(" ", "·")
    for position in range(n - 1, -1, -1):
        if inspection.labels[position].strip("·") == wanted.strip("·"):
            return position
    shown = ", ".join(f"{i}:{label!r}" for i, label in enumerate(inspection.labels[:60]))
    raise UserError(f"--token {choice!r} is not one of the prompt's tokens; give a position or one of: {shown}")
