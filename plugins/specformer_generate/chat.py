"""``specformer chat CKPT`` (and ``generate --interactive``): a conversation on standard input.

Each line read is one turn: it is added to the conversation (with its newline) and the
model's continuation is printed, ending at an eos token, a ``--stop`` string or
``--max-new-tokens``. A :class:`~specformer_generate.session.Session` keeps the KV cache
between turns, so each turn runs only its own tokens. When a turn no longer fits in the
context, the conversation starts over from that turn (with a note on stderr). The
replies go to stdout, notes and the ``>`` marker (on a terminal) to stderr.
"""

from __future__ import annotations

import sys
from typing import Any

from specformer.errors import UserError
from specformer.tokenizer import Tokenizer
from specformer_generate.prompt_input import encode, prompt_source, read_stdin
from specformer_generate.session import Session


def chat(model: Any, tokenizer: Tokenizer, args: Any, *, sampler: Any, seed: int | None, eos: list[int] | None,
         default_new: int) -> int:
    if args.prompt_file == "-":
        raise UserError("in a chat, standard input carries the turns; give the opening text with --prompt or "
                        "--prompt-file PATH")
    if args.no_cache or args.compile:
        raise UserError("a chat keeps its KV cache between turns and runs uncompiled; drop --no-cache and --compile")
    if args.batch or args.stream or (args.num_beams or 1) > 1:
        raise UserError("a chat answers one turn at a time as it is generated; drop --batch, --stream and --num-beams")
    session = Session(model, sampler=sampler, seed=seed, eos_token_id=eos, max_memory=args.max_memory)
    opening = prompt_source(args, required=False)
    if opening is not None:
        text, where = opening
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
        _reply(session, tokenizer, per_turn=per_turn, stops=args.stop, ids_mode=args.ids)


def _reply(session: Session, tokenizer: Tokenizer, *, per_turn: int, stops: list[str], ids_mode: bool) -> None:
    """Print the reply as it is generated, up to the first stop string."""
    from specformer_generate.cli import continuation_text

    new: list[int] = []
    shown = ""
    for token in session.reply(max_new_tokens=per_turn):
        new.append(token)
        if ids_mode:
            sys.stdout.write(("" if len(new) == 1 else " ") + str(token))
            sys.stdout.flush()
            continue
        text, stopped = continuation_text(tokenizer, new, stops)
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
        if stopped:
            break
    if not ids_mode:
        text, _ = continuation_text(tokenizer, new, stops)
        sys.stdout.write(text[len(shown):])
        shown = text
    sys.stdout.write("" if shown.endswith("\n") else "\n")
    sys.stdout.flush()
