"""Chat and instruction data: jsonl conversations as packed rows with a loss mask on the assistant's tokens.

A ``.jsonl`` file whose records hold ``messages`` (a list of ``{"role", "content"}``) or
``prompt`` and ``completion`` is read as training conversations. Each conversation is
rendered with the chat template (:mod:`specformer_text.chat_template`) piece by piece:
for each assistant message the text up to it with the generation prompt (``<|im_start|>
assistant\\n``) is the context, and what the full rendering adds after that (the reply and
its end marker) is the assistant's. The pieces are tokenized one after another (special
tokens atomic, no BOS added by the tokenizer: the template writes its own), and the mask is
True on the assistant's tokens only. A prompt/completion record without any template is
the prompt followed by the completion and the end-of-text token (these two counted).

Conversations follow each other separated by the end-of-text token (never counted), so
packing and document masking work as for plain text; rows are cut and shuffled exactly as
:class:`~specformer_train.PackedRows` cuts text, the mask cut beside the tokens.
"""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from specformer.errors import UserError
from specformer_text import TemplateError, render
from specformer_train import EvalRows, PackedRows, split_tokens


def looks_like_chat(path: str | None) -> bool:
    """A single .jsonl file whose first record has ``messages`` or ``prompt``/``completion``."""
    if path is None or not path.endswith(".jsonl") or not Path(path).is_file():
        return False
    try:
        for _, line in _lines(path):
            if line.strip():
                try:
                    record = json.loads(line)
                except RecursionError:  # too deep to parse here: its keys say what it was meant as, and the
                    return '"messages"' in line or '"completion"' in line  # reader then names its line
                return isinstance(record, dict) and ("messages" in record or "completion" in record)
    except (OSError, UserError, json.JSONDecodeError):
        return False
    return False


def read_records(path: str) -> list[dict[str, Any]]:
    """Every record of a chat jsonl, checked; UserError naming the first bad line and what is accepted."""
    records = list(iter_records(path))
    if not records:
        raise UserError(f"{path}: holds no conversations")
    return records


def iter_records(path: str | Path, *, skip: int = 0) -> Iterator[dict[str, Any]]:
    """The records of a chat jsonl from record ``skip`` on (blank lines are not records), checked as read."""
    index = 0
    for number, line in _lines(path):
        if not line.strip():
            continue
        if index >= skip:
            where = f"{path}, line {number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{where}: not JSON ({exc.msg})") from None
            except RecursionError:
                raise UserError(f"{where}: nested too deeply to read; a record is one JSON object whose 'messages' "
                                "are {role, content} objects") from None
            yield _checked(record, where)
        index += 1


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """``(line number, text)`` of each line; a UTF-8 byte order mark at the start (as Windows tools write) is dropped."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if number == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            try:
                yield number, raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise UserError(f"{path}, line {number}: not UTF-8 text (byte {exc.start + 1} of the line, "
                                f"{raw[exc.start:exc.start + 1]!r}: {exc.reason})") from None


def _checked(record: Any, where: str) -> dict[str, Any]:
    accepted = ('accepted: {"messages": [{"role": "user", "content": "..."}, {"role": "assistant", "content": "..."}]} '
                'or {"prompt": "...", "completion": "..."}')
    if not isinstance(record, dict):
        raise UserError(f"{where}: a record must be a JSON object; {accepted}")
    if "messages" in record:
        messages = record["messages"]
        if not (isinstance(messages, list) and messages and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages)):
            raise UserError(f"{where}: 'messages' must be a non-empty list of {{role, content}} strings; {accepted}")
        for i, m in enumerate(messages):
            _check_text(m["role"], where, f"messages[{i}].role")
            _check_text(m["content"], where, f"messages[{i}].content")
        if not any(m["role"] == "assistant" for m in messages):
            raise UserError(f"{where}: the conversation has no assistant message, so nothing to learn from it")
        return {"messages": messages}
    if isinstance(record.get("prompt"), str) and isinstance(record.get("completion"), str):
        _check_text(record["prompt"], where, "prompt")
        _check_text(record["completion"], where, "completion")
        return {"prompt": record["prompt"], "completion": record["completion"]}
    raise UserError(f"{where}: neither 'messages' nor 'prompt' and 'completion' strings; {accepted}")


def _check_text(text: str, where: str, field: str) -> None:
    """Refuse a lone surrogate escape (``"\\ud800"``): valid JSON, but no character, so no tokenizer can encode it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(f"{where}: {field} holds the lone surrogate escape \\u{ord(text[exc.start]):04x} at character "
                        f"{exc.start}, which is half of a UTF-16 pair and no character; write the character itself "
                        f"or its full surrogate pair") from None


def _encode_text(tokenizer: Any, text: str) -> list[int]:
    inner = getattr(tokenizer, "inner", None)
    if inner is not None:  # a Hugging Face tokenizer: no BOS/EOS added, the template writes its own
        return inner.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text)


def conversation_pieces(messages: list[dict[str, Any]], template: str, tokens: dict[str, str]) -> list[tuple[str, bool]]:
    """The rendered conversation as (text, is_assistant) pieces whose concatenation is the full rendering."""
    full = render(template, messages, **tokens)
    pieces: list[tuple[str, bool]] = []
    done = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        context = render(template, messages[:i], add_generation_prompt=True, **tokens)
        through = render(template, messages[: i + 1], **tokens)
        if not (full.startswith(through) and through.startswith(context) and context.startswith(full[:done])
                and len(context) >= done):
            raise TemplateError("the chat template does not render a conversation as a growing text (the text up "
                                "to a reply is not a prefix of the whole), so the assistant's tokens cannot be found")
        pieces += [(context[done:], False), (through[len(context):], True)]
        done = len(through)
    pieces.append((full[done:], False))
    return [(text, assistant) for text, assistant in pieces if text]


def encode_record(record: dict[str, Any], tokenizer: Any, template: tuple[str, dict[str, str]] | None
                  ) -> tuple[list[int], list[bool]]:
    """Token ids of one record and, for each, whether the loss counts it (the assistant's or completion's)."""
    if "prompt" in record and template is None:
        prompt, completion = _encode_text(tokenizer, record["prompt"]), _encode_text(tokenizer, record["completion"])
        return prompt + completion, [False] * len(prompt) + [True] * len(completion)
    if template is None:
        raise UserError("conversations ('messages') need a chat template: the train.init checkpoint has none, so "
                        "name one with train.chat_template (chatml, or a Jinja file)")
    messages = record.get("messages") or [{"role": "user", "content": record["prompt"]},
                                          {"role": "assistant", "content": record["completion"]}]
    ids: list[int] = []
    mask: list[bool] = []
    for text, assistant in conversation_pieces(messages, *template):
        piece = _encode_text(tokenizer, text)
        ids += piece
        mask += [assistant] * len(piece)
    return ids, mask


def eot_counts(record: dict[str, Any], template: tuple[str, dict[str, str]] | None) -> bool:
    """Whether the end-of-text after ``record`` is a target the loss counts: without a template the one after a
    completion is its end marker (learnt, so generation stops); after a templated conversation it only separates."""
    return "prompt" in record and template is None


@dataclass
class ChatCorpus:
    """Every conversation's tokens, end-of-text separated, and the loss mask beside them."""

    tokens: np.ndarray  # (N,) int32/int64
    mask: np.ndarray  # (N,) bool: True where the token is a target the loss counts
    conversations: int
    description: str


def encode_file(path: str, tokenizer: Any, template: tuple[str, dict[str, str]] | None) -> ChatCorpus:
    records = read_records(path)
    ids: list[int] = [tokenizer.eot_id]  # a row's first input opens a conversation, as for text
    mask: list[bool] = [False]
    for record in records:
        piece, counted = encode_record(record, tokenizer, template)
        ids += piece + [tokenizer.eot_id]
        mask += counted + [eot_counts(record, template)]
    if not any(mask):
        raise UserError(f"{path}: no assistant or completion tokens to train on")
    dtype = np.int32 if max(ids) < 2**31 else np.int64
    kind = "conversations" if any("messages" in r for r in records) else "prompt/completion pairs"
    return ChatCorpus(tokens=np.asarray(ids, dtype=dtype), mask=np.asarray(mask, dtype=bool),
                      conversations=len(records), description=f"{path} ({len(records)} {kind}, loss on replies only)")


class ChatRows(PackedRows):
    """Packed rows of a chat corpus, with :meth:`loss_mask` giving the mask of the same rows."""

    def __init__(self, tokens: np.ndarray, mask: np.ndarray, *, seq_len: int, seed: int) -> None:
        super().__init__(tokens, seq_len=seq_len, seed=seed)
        self._mask = PackedRows(mask, seq_len=seq_len, seed=seed)  # the same cuts and order

    def loss_mask(self, first: int, count: int) -> np.ndarray:
        """``(count, seq_len + 1)`` bool, aligned with :meth:`rows` (the trainer counts targets ``[:, 1:]``)."""
        return self._mask.rows(first, count).astype(bool)


class ChatEvalRows(EvalRows):
    """Validation rows of a chat corpus, with the mask of the same rows."""

    def __init__(self, tokens: np.ndarray, mask: np.ndarray, *, seq_len: int) -> None:
        super().__init__(tokens, seq_len=seq_len)
        self._mask = EvalRows(mask, seq_len=seq_len)

    def loss_mask(self, indices: np.ndarray) -> np.ndarray:
        return self._mask.rows(indices).astype(bool)


@dataclass
class ChatData:
    """What the train plugin needs of a chat corpus (see its ``specformer_train_rows`` hook)."""

    train_rows: ChatRows
    val_rows: ChatEvalRows | None
    description: str
    n_tokens: int
    n_train: int
    n_val: int


def chat_data(corpus: ChatCorpus, *, seq_len: int, seed: int, val_fraction: float) -> ChatData:
    """Train and validation rows, the last ``val_fraction`` of the tokens held out (as for text)."""
    split = split_tokens(corpus.tokens, val_fraction=val_fraction, seq_len=seq_len)
    n_train = len(split.train)
    train = ChatRows(split.train, corpus.mask[:n_train], seq_len=seq_len, seed=seed)
    val = None if split.val is None else ChatEvalRows(split.val, corpus.mask[n_train:], seq_len=seq_len)
    return ChatData(train_rows=train, val_rows=val, description=corpus.description, n_tokens=len(corpus.tokens),
                    n_train=n_train, n_val=0 if split.val is None else len(split.val))
