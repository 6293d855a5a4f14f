"""Constraints: allow only the tokens that keep the generated text inside a grammar (llguidance matches it).

``regex``, ``choice``, ``json_schema`` and ``grammar`` differ only in how their grammar is
written; the matching is llguidance's (no matcher of our own). A constraint is built from its
settings alone (the grammar is compiled and checked then, so a bad one is refused before any
model runs), and is bound to a generation call by :meth:`Constraint.for_run`, which knows
the tokenizer, the end-of-sequence ids and the prompt width (the column where generated
tokens start in the ``input_ids`` the sampler reads; prompts are left padded to it).

The bound step keeps one llguidance matcher per row and the tokens it has consumed. Each call
brings the matcher up to the row's generated tokens: it rolls back to the longest common
prefix and consumes the rest. So a row whose history changes under it, as beam search
reorders beams and speculative decoding drops rejected drafts, is followed exactly. A row
whose tokens the grammar does not accept (a finished row's padding, a draft position that
verification discards anyway) keeps its logits unchanged: nothing drawn there is kept.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor

from specformer_generate.samplers.grammar_tokenizer import grammar_tokenizer, llguidance_module
from specformer_generate.samplers.params import ChoiceParams, GrammarParams, JsonSchemaParams, RegexParams

#: Lines of an llguidance error that quote the grammar under a caret: the message says it in words already.
_QUOTE_LINE = re.compile(r"^\s*(\d+\s*\|.*|\^+\s*)$")


def _one_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip() and not _QUOTE_LINE.match(line)]
    return "; ".join(lines)


class Constraint:
    """Common part of the four constraint samplers: a compiled llguidance grammar, bound per call."""

    name = "constraint"

    def __init__(self, grammar: str, *, shown: str) -> None:
        llguidance = llguidance_module()
        error = llguidance.LLMatcher.validate_grammar(grammar)
        if error:
            raise ValueError(f"{self.name}: {_one_line(error)}")
        self.grammar = grammar
        self.shown = shown

    def for_run(self, *, tokenizer: Any, vocab_size: int, eos: Sequence[int], prompt_width: int) -> "BoundConstraint":
        """The step for one generation call: one matcher per row, starting at column ``prompt_width``."""
        llguidance = llguidance_module()
        tok = grammar_tokenizer(tokenizer, vocab_size=vocab_size, eos=eos, what=self.name)
        start = llguidance.LLMatcher(tok, self.grammar, log_level=0)
        if start.is_error():
            raise ValueError(f"{self.name}: {_one_line(start.get_error())}")
        return BoundConstraint(start, prompt_width=prompt_width, eos=eos, vocab_size=vocab_size, shown=repr(self))

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        raise ValueError(f"{self!r} needs the tokenizer and where the prompt ends: generate() binds it "
                         f"(Sampler.for_run); it cannot run on logits alone")

    def __repr__(self) -> str:
        return f"{self.name}({self.shown})"


class BoundConstraint:
    """A constraint during one call: ``(logits (B, V), input_ids (B, T)) -> logits`` with disallowed tokens at -inf."""

    def __init__(self, start: Any, *, prompt_width: int, eos: Sequence[int], vocab_size: int, shown: str) -> None:
        self.start = start
        self.prompt_width = prompt_width
        self.eos = set(int(e) for e in eos)
        self.vocab_size = vocab_size
        self.shown = shown
        self.rows: list[tuple[Any, list[int]]] = []  # per row: its matcher and the tokens it consumed

    def __call__(self, logits: Tensor, input_ids: Tensor) -> Tensor:
        generated = input_ids[:, self.prompt_width:].tolist()  # (B, t): what each row produced so far
        while len(self.rows) < len(generated):
            self.rows.append((self.start.deep_copy(), []))
        masks, constrained = [], []
        for row, tokens in enumerate(generated):
            matcher, ok = self._follow(row, tokens)
            if ok:
                masks.append(matcher.compute_bitmask())
                constrained.append(row)
        if not constrained:
            return logits
        packed = torch.frombuffer(bytearray(b"".join(masks)), dtype=torch.uint8).view(len(constrained), -1)
        bits = (packed[:, :, None] >> torch.arange(8, dtype=torch.uint8)) & 1  # (R, V/8, 8): bit i of byte j is token 8j+i
        allowed = bits.view(len(constrained), -1)[:, : logits.shape[-1]].bool().to(logits.device)  # (R, V)
        index = torch.tensor(constrained, device=logits.device)
        out = logits.clone()
        out[index] = logits[index].masked_fill(~allowed, float("-inf"))
        return out

    def _follow(self, row: int, tokens: list[int]) -> tuple[Any, bool]:
        """Bring row ``row``'s matcher to ``tokens``; False when the grammar does not accept them."""
        matcher, consumed = self.rows[row]
        # A finished row holds its end-of-sequence token then padding: the grammar sees the text before it.
        end = next((i for i, t in enumerate(tokens) if t in self.eos or t < 0), len(tokens))
        text, ended = tokens[:end], end < len(tokens)
        common = 0
        limit = min(len(consumed), len(text))
        while common < limit and consumed[common] == text[common]:
            common += 1
        if common < len(consumed):
            if not matcher.rollback(len(consumed) - common):
                matcher = self.start.deep_copy()
                common = 0
            consumed = consumed[:common]
        taken = matcher.try_consume_tokens(text[common:]) if common < len(text) else 0
        consumed = consumed + text[common:common + taken]
        self.rows[row] = (matcher, consumed)
        return matcher, len(consumed) == len(text) and not ended and not matcher.is_error()

    def __repr__(self) -> str:
        return self.shown


class Regex(Constraint):
    """Allow only tokens that keep the text a prefix of a match of ``pattern`` (:class:`RegexParams`)."""

    Params = RegexParams
    name = "regex"

    def __init__(self, params: RegexParams) -> None:
        grammar = llguidance_module().LLMatcher.grammar_from_regex(params.pattern)
        super().__init__(grammar, shown=f"pattern={params.pattern!r}")


class Choice(Constraint):
    """Allow only tokens that spell one of ``options`` (:class:`ChoiceParams`)."""

    Params = ChoiceParams
    name = "choice"

    def __init__(self, params: ChoiceParams) -> None:
        # Lark string literals take JSON's escapes, so json.dumps quotes any option safely.
        lark = "start: " + " | ".join(json.dumps(option) for option in params.options)
        grammar = llguidance_module().LLMatcher.grammar_from_lark(lark)
        super().__init__(grammar, shown=f"options={list(params.options)!r}")


class JsonSchema(Constraint):
    """Allow only tokens that keep the text a prefix of JSON that ``schema`` accepts (:class:`JsonSchemaParams`)."""

    Params = JsonSchemaParams
    name = "json_schema"

    def __init__(self, params: JsonSchemaParams) -> None:
        schema, shown = params.schema, "schema={...}"
        if isinstance(schema, str):
            schema, shown = _read_schema(schema), f"schema={params.schema!r}"
        try:
            # Fixed separators, no free whitespace: a small model would otherwise spend its tokens on blanks.
            grammar = llguidance_module().LLMatcher.grammar_from_json_schema(
                schema, overrides={"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "})
        except ValueError as exc:
            raise ValueError(f"json_schema: {_one_line(str(exc))}") from None
        super().__init__(grammar, shown=shown)


class Grammar(Constraint):
    """Allow only tokens that keep the text a prefix of a sentence of a Lark grammar (:class:`GrammarParams`)."""

    Params = GrammarParams
    name = "grammar"

    def __init__(self, params: GrammarParams) -> None:
        grammar = llguidance_module().LLMatcher.grammar_from_lark(params.lark)
        first = params.lark.strip().splitlines()[0] if params.lark.strip() else ""
        super().__init__(grammar, shown=f"lark={first[:40]!r}{'...' if len(params.lark.strip()) > 40 else ''}")


def _read_schema(path: str) -> Any:
    """The JSON Schema in the file ``path``; a ValueError naming the file when it is not one."""
    from specformer.errors import InputError  # late: read only for a schema given as a file
    from specformer.files.datafile import read_text  # late: read only for a schema given as a file

    if not Path(path).is_file():
        raise ValueError(f"json_schema: schema {path!r} is neither an object nor a JSON file that exists")
    try:
        data = json.loads(read_text(Path(path), what="JSON schema"))
    except (InputError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"json_schema: {path}: not a JSON file ({exc})") from None
    if not isinstance(data, (dict, bool)):
        raise ValueError(f"json_schema: {path} holds a {type(data).__name__}; a JSON Schema is an object")
    return data
