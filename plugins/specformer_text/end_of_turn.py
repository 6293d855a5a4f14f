"""Where a chat turn ends: the one answer to "which tokens or text end the model's reply" under a template.

A model fine-tuned on a chat template closes each of its turns with the template's end
marker (ChatML's ``<|im_end|>``, Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``), not
with the end-of-text token a plain corpus taught it; a reply must stop there. The markers
of a template are gathered from three places:

- the known end markers (:data:`KNOWN_MARKERS`) that appear in the template's source
  (a template writes its own marker literally; which role or position it follows does
  not matter: a reply ends at the first one);
- the tokenizer's ``eos_token`` from the checkpoint's tokenizer_config.json (a template
  that writes ``{{ eos_token }}`` ends turns with it);
- the ids in the checkpoint's generation_config.json ``eos_token_id`` (an int or a list:
  Llama 3 names both ``<|end_of_text|>`` and ``<|eot_id|>``), as hf import keeps them.

Each marker then becomes what the tokenizer can recognise: a marker that is one token of
the vocabulary ends the reply on that id (and the id is not part of the reply's text); a
marker the tokenizer spells with several tokens (the byte tokenizer spells every marker
byte by byte) ends the reply once the decoded text contains it, and the text is cut
where it starts. :meth:`TurnEnd.settled` is what a stream may show meanwhile: the text
without a tail that could still become a marker.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specformer_text.header_keys import GENERATION_CONFIG_KEY, TOKENIZER_CONFIG_KEY

#: End-of-turn markers of widespread chat formats: ChatML, Llama 3, Gemma, Phi-3, Llama 2 / Mistral, GPT-2 style.
KNOWN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "</s>", "<|endoftext|>")


@dataclass(frozen=True)
class TurnEnd:
    """What ends a reply: any of ``ids`` (one-token markers), or text containing any of ``strings``."""

    ids: frozenset[int] = frozenset()
    strings: tuple[str, ...] = ()

    def cut(self, text: str) -> tuple[str, bool]:
        """``text`` up to the first marker string in it (the marker dropped); and whether there was one."""
        found = [text.find(marker) for marker in self.strings if marker in text]
        return (text[: min(found)], True) if found else (text, False)

    def settled(self, text: str) -> str:
        """``text`` less a tail that may be the start of a marker string (a stream holds it back until it is not)."""
        end = len(text)
        for marker in self.strings:
            for size in range(min(len(marker) - 1, len(text)), 0, -1):
                if text.endswith(marker[:size]):
                    end = min(end, len(text) - size)
                    break
        return text[:end]

    def visible(self, tokens: list[int]) -> list[int]:
        """``tokens`` without a final end id (the marker token is not part of the reply)."""
        return tokens[:-1] if tokens and tokens[-1] in self.ids else tokens


def template_markers(source: str) -> list[str]:
    """The known end markers that the template ``source`` writes, in :data:`KNOWN_MARKERS` order."""
    return [marker for marker in KNOWN_MARKERS if marker in source]


def turn_end(source: str, *, tokenizer: Any, metadata: dict[str, str] | None = None) -> TurnEnd:
    """What ends a reply under the chat template ``source``, for ``tokenizer`` and a checkpoint's header ``metadata``.

    ``tokenizer`` is a :class:`specformer.tokenizers.tokenizer.Tokenizer` (or anything with ``encode``,
    ``decode`` and ``kind``); a ``none`` tokenizer (ids only) keeps only the header's ids.
    """
    markers = template_markers(source)
    eos_token = _eos_token(metadata)
    if eos_token and eos_token not in markers:
        markers.append(eos_token)
    ids = set(_generation_eos(metadata))
    strings: list[str] = []
    if getattr(tokenizer, "kind", None) != "none":
        for marker in markers:
            token = single_token(tokenizer, marker)
            if token is not None:
                ids.add(token)
            elif marker not in strings:
                strings.append(marker)
    vocab = getattr(tokenizer, "vocab_size", None)
    kept = frozenset(i for i in ids if i >= 0 and (vocab is None or i < vocab))
    return TurnEnd(ids=kept, strings=tuple(strings))


def single_token(tokenizer: Any, marker: str) -> int | None:
    """The id of the one token that is ``marker`` in ``tokenizer``'s vocabulary, else None."""
    eot_id = getattr(tokenizer, "eot_id", None)
    # The end-of-text token is a special id outside the text (the byte tokenizer's 256), not the bytes of its name.
    if eot_id is not None and marker == getattr(tokenizer, "eot_token", "<|endoftext|>"):
        return int(eot_id)
    inner = getattr(tokenizer, "inner", None)  # a Hugging Face ``tokenizers`` tokenizer: added tokens included
    if inner is not None:
        token = inner.token_to_id(marker)
        return None if token is None else int(token)
    ids = tokenizer.encode(marker)
    return int(ids[0]) if len(ids) == 1 and tokenizer.decode(ids) == marker else None


def _header_json(metadata: dict[str, str] | None, key: str) -> dict[str, Any]:
    # A damaged header entry is not worth failing a chat over: it only adds ways to stop.
    try:
        value = json.loads((metadata or {}).get(key) or "null")
    except (json.JSONDecodeError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _eos_token(metadata: dict[str, str] | None) -> str | None:
    value = _header_json(metadata, TOKENIZER_CONFIG_KEY).get("eos_token")
    if isinstance(value, dict):  # older configs: {"content": "</s>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _generation_eos(metadata: dict[str, str] | None) -> list[int]:
    value = _header_json(metadata, GENERATION_CONFIG_KEY).get("eos_token_id")
    values = value if isinstance(value, list) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
