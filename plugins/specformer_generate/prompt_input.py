"""Where ``specformer generate`` gets its prompts: ``--prompt``, ``--prompt-file`` or standard input.

Standard input is read with ``--prompt-file -``, and also when neither option is given and
standard input is not a terminal (``echo "def " | specformer generate CKPT``), as Unix
filters do; on a terminal, no prompt is an error rather than a wait for typed text.

A prompt is text (encoded with the checkpoint's tokenizer) or, with ``--ids``, token ids
written as numbers. ``--batch`` reads one prompt per line. Every mistake is one
:class:`~specformer.errors.UserError`: no prompt, text that is not UTF-8, an empty prompt.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specformer.errors import UserError
from specformer.tokenizers.tokenizer import Tokenizer


@dataclass
class Prompt:
    text: str | None  # what the user wrote (None for token ids)
    ids: list[int]


def prompt_source(args: Any, *, required: bool = True) -> tuple[str, str] | None:
    """``(text, where)`` from ``--prompt`` or ``--prompt-file`` (``-``: standard input); None when neither.

    ``required``: a prompt must be given, and standard input that is not a terminal gives it
    when neither option does (a chat asks with False: its standard input carries the turns).
    """
    if args.prompt is not None and args.prompt_file is not None:
        raise UserError("give the prompt once: --prompt TEXT or --prompt-file PATH, not both")
    if args.prompt is not None:
        try:
            args.prompt.encode("utf-8")
        except UnicodeEncodeError as exc:
            bad = args.prompt[exc.start].encode("utf-8", "surrogateescape")
            raise UserError(f"--prompt is not UTF-8 text (byte 0x{bad[0]:02x} at character {exc.start}); "
                            f"pass UTF-8, or put the text in a UTF-8 file for --prompt-file") from None
        return args.prompt, "--prompt"
    if args.prompt_file is None and required and stdin_is_piped():
        return _decoded(read_stdin(), where="standard input")
    if args.prompt_file is not None:
        where = "standard input" if args.prompt_file == "-" else args.prompt_file
        data = read_stdin() if args.prompt_file == "-" else _read_bytes(Path(args.prompt_file))
        return _decoded(data, where=where)
    if required:
        raise UserError("give the text to continue with --prompt TEXT, --prompt-file PATH, or on standard input "
                        "(a pipe or file: `echo TEXT | specformer generate CKPT`)")
    return None


def _decoded(data: bytes, *, where: str) -> tuple[str, str]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                        f"save it as UTF-8") from None
    return _drop_final_newline(text), where


def stdin_is_piped() -> bool:
    """Whether standard input is a pipe or a file to read: not a terminal, not closed, not an unreadable stand-in."""
    stdin = sys.stdin
    if stdin is None:
        return False
    try:
        return not stdin.isatty() and stdin.readable()
    except (ValueError, OSError):  # closed
        return False


def read_prompts(args: Any, tokenizer: Tokenizer, *, vocab_size: int) -> list[Prompt]:
    """Every prompt of the command (one, or one per line with ``--batch``), encoded."""
    source = prompt_source(args)
    assert source is not None
    text, where = source
    pieces = [line for line in text.splitlines() if line.strip()] if args.batch else [text]
    if not pieces or not pieces[0]:
        what = "has no non-blank line" if args.batch else "is empty"
        raise UserError(f"{where} {what}; give at least one character of text to continue")
    return [encode(piece, tokenizer, ids_mode=args.ids, where=where, vocab_size=vocab_size) for piece in pieces]


def encode(text: str, tokenizer: Tokenizer, *, ids_mode: bool, where: str, vocab_size: int) -> Prompt:
    """One prompt: token ids parsed (``--ids``) or the text encoded."""
    if ids_mode:
        ids = parse_ids(text, where=where)
    else:
        ids = tokenizer.encode(text)
        if not ids:
            raise UserError(f"{where} {text[:40]!r} encodes to no tokens; give some text the tokenizer can encode")
    outside = [i for i in ids if not 0 <= i < vocab_size]
    if outside:
        cause = "" if ids_mode else "; the checkpoint's tokenizer does not belong to this model"
        raise UserError(f"{where}: token id {outside[0]} is outside the model's vocabulary of {vocab_size}{cause}")
    return Prompt(text=None if ids_mode else text, ids=ids)


def parse_ids(text: str, *, where: str) -> list[int]:
    """``"1 2 3"`` or ``"1,2,3"`` -> ``[1, 2, 3]``."""
    parts = [p for p in re.split(r"[\s,]+", text.strip()) if p]
    if not parts or not all(p.isdigit() for p in parts):
        raise UserError(f"{where} with --ids must be token ids separated by spaces or commas, such as '12 7 99', "
                        f"got {text[:40]!r}")
    return [int(p) for p in parts]


def read_stdin(*, line: bool = False) -> bytes:
    """Standard input (all of it, or one line) as bytes, so that its encoding is checked here."""
    buffer = getattr(sys.stdin, "buffer", None)  # a text-only stand-in (a test's StringIO) has none
    if buffer is not None:
        return buffer.readline() if line else buffer.read()
    text = sys.stdin.readline() if line else sys.stdin.read()
    return text.encode("utf-8", "surrogateescape")


def _read_bytes(path: Path) -> bytes:
    if path.is_dir():
        raise UserError(f"--prompt-file {path}: is a directory, not a text file")
    if not path.is_file():
        raise UserError(f"--prompt-file {path}: no such file")
    return path.read_bytes()


def _drop_final_newline(text: str) -> str:
    # `echo "def " | specformer generate ... --prompt-file -` means the prompt "def ", not "def \n".
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text
