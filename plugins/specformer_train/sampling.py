"""Short samples during training, through the generation plugin when it is installed.

The generate plugin is an optional companion: when ``specformer_generate`` cannot be
imported, training simply prints no samples. Sampling runs under a forked RNG, so
whether and how much a run samples never changes its training (a resumed run matches
an uninterrupted one).

A chat run (chat data; the fine-tuning plugin hands over its ``chat`` prompting) samples a
conversation instead: ``sample_prompt`` as a user message rendered with the run's chat
template, answered up to the template's end of turn, shown as ``user: ...`` /
``assistant: ...`` lines.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from specformer.tokenizers.tokenizer import Tokenizer


def load_generate() -> Callable[..., Any] | None:
    """The generate plugin's ``generate``, or None when the plugin is not installed."""
    try:
        import specformer_generate  # late: an optional companion plugin (the module doc)
    except ImportError:
        return None
    return specformer_generate.generate


def sample_text(model: nn.Module, tokenizer: Tokenizer, *, prompt: str, max_new_tokens: int, temperature: float,
                top_k: int | None, seed: int, device: torch.device, chat: Any = None) -> str | None:
    """``prompt`` continued by the model from a document start (an end-of-text token) to the next one.

    ``chat`` (an object with ``prompt(text)``, ``turn_end`` and ``transcript(text, reply)``): ``prompt``
    is a user message instead, answered up to the end of the turn.
    """
    generate = load_generate()
    if generate is None or max_new_tokens <= 0:
        return None
    if chat is not None:
        ids = [tokenizer.eot_id, *tokenizer.encode(chat.prompt(prompt))]
        eos = sorted({tokenizer.eot_id, *chat.turn_end.ids})
        stop = [seq for seq in (tokenizer.encode(s) for s in chat.turn_end.strings) if seq] or None
    else:
        ids = [tokenizer.eot_id, *tokenizer.encode(prompt)]
        eos, stop = [tokenizer.eot_id], None
    budget = model.context_length - len(ids)
    if budget <= 0:
        return None
    sampler_spec: list[dict[str, Any]] = []
    if top_k is not None:
        sampler_spec.append({"kind": "top_k", "k": top_k})
    sampler_spec.append({"kind": "temperature", "value": temperature})
    was_training = model.training
    model.eval()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
            out = generate(model, [ids], max_new_tokens=min(max_new_tokens, budget), sampler=sampler_spec,
                           seed=seed, eos_token_id=eos, stop=stop)
    finally:
        model.train(was_training)
    new = list(out[0])[len(ids):]
    ends = [i for i, token in enumerate(new) if token in eos]
    if ends:
        new = new[: ends[0]]
    if chat is None:
        return prompt + tokenizer.decode(new)
    return chat.transcript(prompt, chat.turn_end.cut(tokenizer.decode(new))[0])
