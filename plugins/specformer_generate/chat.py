"""``specformer chat CKPT`` (and ``generate --interactive``): a conversation on standard input.

Each line read is one turn. A :class:`~specformer_generate.session.Session` keeps the KV
cache between turns, so each turn runs only its own tokens.

- **Plain text** (no chat template): the line is added to the conversation (with its
  newline) and the model's continuation is printed, ending at an eos token, a ``--stop``
  string or ``--max-new-tokens``. When a turn no longer fits in the context, the
  conversation starts over from that turn (with a note on stderr).
- **With a chat template** (``--chat-template``, or the checkpoint's own; see
  :mod:`.chat_format`): the line is a user message, ``--prompt`` a system message. Each
  turn the whole conversation is rendered again; when that text's tokens begin with the
  tokens already in the session (the last rendering, then the reply as generated), only
  the new ones are fed; when they do not (a template that rewrites earlier turns, a reply
  the tokenizer would spell differently), the session is cleared and the whole rendering
  is read again. The reply ends at the template's end of turn, which is not printed.
  When the conversation no longer fits, the oldest turns are dropped (system message kept).

The replies go to stdout, notes and the ``>`` marker (on a terminal) to stderr. When
standard input is not a terminal (a pipe, a file), stdout is a transcript: each turn is
written as a ``user: ...`` line before its reply, and the reply starts with ``assistant: ``.
"""

from __future__ import annotations

import sys
from typing import Any

from specformer.errors import UserError
from specformer.tokenizers.tokenizer import Tokenizer
from specformer_generate.chat_format import ChatFormat
from specformer_generate.continuation import continuation_text, shown_so_far
from specformer_generate.prompt_input import encode, prompt_source, read_stdin
from specformer_generate.session import Session

#: What starts each turn, and each reply, in the transcript written when standard input is not a terminal.
USER_MARK = "user: "
ASSISTANT_MARK = "assistant: "


def chat(model: Any, tokenizer: Tokenizer, args: Any, *, sampler: Any, seed: int | None, eos: list[int] | None,
         default_new: int, template: ChatFormat | None = None, turn_end: Any = None) -> int:
    """Answer each line of standard input in turn; ``turn_end`` (a :class:`specformer_finetune.TurnEnd`, or None)
    ends a reply besides ``eos``."""
    if args.prompt_file == "-":
        raise UserError("in a chat, standard input carries the turns; give the opening text with --prompt or "
                        "--prompt-file PATH")
    if args.no_cache or args.compile:
        raise UserError("a chat keeps its KV cache between turns and runs uncompiled; drop --no-cache and --compile")
    if args.batch or args.stream or (args.num_beams or 1) > 1:
        raise UserError("a chat answers one turn at a time as it is generated; drop --batch, --stream and --num-beams")
    session = Session(model, sampler=sampler, seed=seed, eos_token_id=eos, max_memory=args.max_memory)
    conversation = _Conversation(template, session, tokenizer) if template is not None else None
    opening = prompt_source(args, required=False)
    if opening is not None:
        text, where = opening
        if conversation is not None:
            conversation.open(text, where=where)
        else:
            ids = encode(text, tokenizer, ids_mode=args.ids, where=where, vocab_size=model.vocab_size).ids
            if len(ids) >= session.room:
                raise UserError(f"{where} is {len(ids)} tokens long; it must leave room in the model's "
                                f"{model.context_length}-token context for the conversation")
            session.append(ids)
    per_turn = args.max_new_tokens or default_new
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        raw = read_stdin(line=True)
        if not raw:
            return 0
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            print(f"error: that line is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                  f"skipped", file=sys.stderr)
            continue
        if not line.strip():
            continue
        if conversation is not None:
            if not conversation.add_user(line.rstrip("\r\n")):
                continue
            if not interactive:
                _mark_turn(line)
            reply = _reply(session, tokenizer, per_turn=per_turn, stops=args.stop, ids_mode=False,
                           turn_end=turn_end, transcript=not interactive)
            conversation.add_reply(reply)
            continue
        turn = line.rstrip("\r\n") if args.ids else line if line.endswith("\n") else line + "\n"
        try:
            ids = encode(turn, tokenizer, ids_mode=args.ids, where="the turn", vocab_size=model.vocab_size).ids
        except UserError as exc:
            print(f"error: {exc}", file=sys.stderr)
            continue
        if len(ids) >= session.room:
            if len(ids) >= model.context_length:
                print(f"error: that turn is {len(ids)} tokens, more than the model's context of "
                      f"{model.context_length} leaves room for; skipped", file=sys.stderr)
                continue
            print(f"note: the context of {model.context_length} tokens is full; starting over from this turn",
                  file=sys.stderr)
            session.reset()
        session.append(ids)
        if not interactive:
            _mark_turn(line)
        _reply(session, tokenizer, per_turn=per_turn, stops=args.stop, ids_mode=args.ids, turn_end=turn_end,
               transcript=not interactive)


def _mark_turn(line: str) -> None:
    """The transcript's line for a turn read from a pipe."""
    sys.stdout.write(USER_MARK + line.rstrip("\r\n") + "\n")
    sys.stdout.flush()


def _reply(session: Session, tokenizer: Tokenizer, *, per_turn: int, stops: list[str], ids_mode: bool,
           turn_end: Any = None, transcript: bool = False) -> str:
    """Print the reply as it is generated, up to the first stop string or end of turn; its text (ids: empty)."""
    if transcript:
        sys.stdout.write(ASSISTANT_MARK)
    new: list[int] = []
    shown = ""
    for token in session.reply(max_new_tokens=per_turn):
        new.append(token)
        if ids_mode:
            sys.stdout.write(("" if len(new) == 1 else " ") + str(token))
            sys.stdout.flush()
            continue
        text, stopped = shown_so_far(tokenizer, new, stops, turn_end)
        if text.startswith(shown):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
        if stopped:
            break
    if not ids_mode:
        text, _ = continuation_text(tokenizer, new, stops, turn_end)
        sys.stdout.write(text[len(shown):])
        shown = text
    sys.stdout.write("" if shown.endswith("\n") else "\n")
    sys.stdout.flush()
    return shown


class _Conversation:
    """The messages of a templated chat, and keeping the session's tokens in step with their rendering."""

    def __init__(self, template: ChatFormat, session: Session, tokenizer: Tokenizer) -> None:
        self.template, self.session, self.tokenizer = template, session, tokenizer
        self.system: list[dict[str, str]] = []
        self.turns: list[dict[str, str]] = []

    def open(self, text: str, *, where: str) -> None:
        """``--prompt``: the system message."""
        self.system = [{"role": "system", "content": text}]
        ids = self._ids(self.system)
        if len(ids) >= self.session.room:
            raise UserError(f"{where} is {len(ids)} tokens long as a system message; it must leave room in the "
                            f"model's {self.session.context_length}-token context for the conversation")

    def add_user(self, text: str) -> bool:
        """Add a user message and feed the session what it does not hold yet; False (and a note) when it cannot fit."""
        self.turns.append({"role": "user", "content": text})
        ids = self._ids(self.system + self.turns)
        context = self.session.context_length
        dropped = False
        while len(ids) >= context and len(self.turns) > 1:
            self.turns = self.turns[2:]  # the oldest user turn and its reply
            ids = self._ids(self.system + self.turns)
            dropped = True
        if len(ids) >= context:
            print(f"error: that turn is {len(ids)} tokens with the chat template, more than the model's context "
                  f"of {context} leaves room for; skipped", file=sys.stderr)
            self.turns.pop()
            return False
        if dropped:
            print(f"note: the context of {context} tokens is full; the oldest turns were dropped", file=sys.stderr)
        held = self.session.tokens
        if len(held) < len(ids) and ids[: len(held)] == held:
            self.session.append(ids[len(held):])  # the cache holds the rest: only the new tokens run
        else:
            self.session.reset()
            self.session.append(ids)
        return True

    def add_reply(self, text: str) -> None:
        self.turns.append({"role": "assistant", "content": text})

    def _ids(self, messages: list[dict[str, str]]) -> list[int]:
        return list(self.tokenizer.encode(self.template.prompt(messages)))
