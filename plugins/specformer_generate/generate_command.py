"""``specformer generate CHECKPOINT --prompt TEXT``: continue a prompt with a saved model; ``specformer chat`` too.

Their flags: :mod:`specformer_generate.cli`.

The tokenizer is chosen by :func:`specformer.tokenizers.choice.checkpoint_tokenizer` (the one
stored in the header, ``--tokenizer FILE``, or the byte tokenizer for a 259-token model
without one), as every command chooses it; the defaults come from the spec's ``generate``
section, and flags override them. The text goes to stdout, the speed to stderr.

With a chat template (``--chat-template NAME|FILE``, or the checkpoint's own unless
``--no-chat-template``; :mod:`.chat_format`) each prompt is one user message, rendered with
the assistant's turn opened, and the output is the reply alone, ended at the template's
end of turn (which is not printed).
"""

from __future__ import annotations

import argparse
import math
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.files.datafile import parse_text, read_text
from specformer.machine.devices import parse_device
from specformer.errors import InputError, SpecError, UserError, excerpt
from specformer.machine.threads import use_threads
from specformer.tokenizers.tokenizer import Tokenizer
from specformer.tokenizers.choice import checkpoint_tokenizer
from specformer.checkpoint.locate import resolve_checkpoint
from specformer_generate.chat import chat
from specformer_generate.chat_format import ChatFormat, chat_format
from specformer_generate.continuation import continuation_text, shown_so_far
from specformer_generate.generation import generate, stream
from specformer_generate.memory import parse_max_memory
from specformer_generate.prompt_input import Prompt, encode, read_prompts
from specformer_generate.samplers.pipeline import Sampler, build_sampler
from specformer_generate.section import GenerateSpec
from specformer_generate.speculative import MTP_NAMES, PROMPT_LOOKUP_NAMES


def run(args: argparse.Namespace) -> int:
    device = parse_device(args.device)
    threads = use_threads(args.threads)
    if args.max_memory is not None:
        try:
            parse_max_memory(args.max_memory)
        except ValueError as exc:
            raise UserError(f"--max-memory: {exc}") from None
    args.checkpoint = str(resolve_checkpoint(args.checkpoint))  # a step-N or run directory: its checkpoint file
    model = specformer.load(args.checkpoint, device=device).eval()  # ours alone: no dropout while generating
    metadata = read_metadata(args.checkpoint)
    tokenizer = checkpoint_tokenizer(metadata, vocab_size=model.vocab_size, where=args.checkpoint,
                                     override=args.tokenizer, ids_only=args.ids)
    template = chat_format(args, metadata, tokenizer)
    section = model.spec.section("generate") or GenerateSpec()
    if args.keep_lm_head_float and args.quantize is None:
        raise UserError("--keep-lm-head-float is an option of --quantize; give --quantize SCHEME too")
    if args.quantize is not None:
        _quantize(model, args.quantize, keep_lm_head_float=args.keep_lm_head_float)

    sampler = parse_sampler_option(args.sampler) if args.sampler is not None else section.build_sampler()
    num_beams = args.num_beams if args.num_beams is not None else section.num_beams
    length_penalty = args.length_penalty if args.length_penalty is not None else section.length_penalty
    if not math.isfinite(length_penalty):  # generate() refuses it too, but as a ValueError (found by fuzzing)
        raise UserError(f"--length-penalty must be a finite number, got {length_penalty}")
    seed = args.seed if args.seed is not None else section.seed
    end_of_text = getattr(tokenizer, "eot_id", None)
    eos = None if args.ignore_eos else (section.eos_ids() or ([end_of_text] if end_of_text is not None else None))
    if template is not None and not args.ignore_eos:
        eos = sorted(set(eos or []) | template.turn_end.ids) or None
    turn_end = None if template is None or args.ignore_eos else template.turn_end
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if num_beams < 1:
        raise UserError(f"--num-beams must be at least 1, got {num_beams}")
    if args.stream and num_beams > 1:
        raise UserError("--stream cannot show beam search (the best beam is only known at the end); drop one of them")
    if args.stream and args.batch:
        raise UserError("--stream shows one prompt as it grows; drop --batch or --stream")
    if args.stop and args.ids:
        raise UserError("--stop matches text, and --ids prompts give token ids; drop one of them")
    if any(not stop for stop in args.stop):
        raise UserError("--stop needs some text; an empty string would stop at once")
    sampler = with_constraint(args, sampler, tokenizer=tokenizer, vocab_size=model.vocab_size, eos=eos)
    draft = _draft(args, model, device, tokenizer) if args.draft is not None else None
    if args.interactive:
        return chat(model, tokenizer, args, sampler=sampler, seed=seed, eos=eos, default_new=section.max_new_tokens,
                    template=template, turn_end=turn_end)

    prompts = read_prompts(args, tokenizer, vocab_size=model.vocab_size)
    if template is not None:
        prompts = [_as_chat(p, template, tokenizer, vocab_size=model.vocab_size) for p in prompts]
    longest = max(len(p.ids) for p in prompts)
    max_new_tokens = new_token_budget(args.max_new_tokens, default=section.max_new_tokens, prompt_length=longest,
                                      model=model)
    settings: dict[str, Any] = dict(max_new_tokens=max_new_tokens, sampler=sampler, seed=seed, eos_token_id=eos,
                                    use_cache=not args.no_cache, compile=args.compile, max_memory=args.max_memory,
                                    tokenizer=tokenizer)
    if draft is not None:
        settings.update(draft=draft, draft_tokens=args.draft_tokens)
    ids = [p.ids for p in prompts]
    start = time.perf_counter()
    ends = turn_end.strings if turn_end is not None else ()
    if num_beams > 1 or not (args.stream or args.stop or ends):
        # A beam ends at a stop text's tokens as the tokenizer spells it (the text is cut again after decoding).
        stop_ids = [tokenizer.encode(s) for s in [*args.stop, *ends]] if num_beams > 1 else []
        out = generate(model, ids, num_beams=num_beams, length_penalty=length_penalty,
                       early_stopping=section.early_stopping, stop=[s for s in stop_ids if s] or None, **settings)
        news = [row[len(prompt):] for row, prompt in zip(out, ids)]
        produced = sum(map(len, news))
        _print_results(prompts, news, tokenizer, args.stop, turn_end, reply_only=template is not None)
    else:
        printer = _StreamPrinter(prompts[0], tokenizer, reply_only=template is not None) if args.stream else None
        news = _generate_with_stops(model, ids, settings, tokenizer, args.stop, printer, turn_end)
        produced = sum(map(len, news))
        if printer is None:
            _print_results(prompts, news, tokenizer, args.stop, turn_end, reply_only=template is not None)
    seconds = time.perf_counter() - start
    print(f"{produced} tokens in {seconds:.2f} s ({produced / max(seconds, 1e-9):.1f} tokens/s, "
          f"{threads} CPU thread{'s' if threads != 1 else ''})", file=sys.stderr)
    return 0


def _draft(args: argparse.Namespace, model: Any, device: torch.device, tokenizer: Tokenizer) -> Any:
    """``--draft``: "ngram", or a checkpoint with the same tokenizer and vocabulary, loaded; a UserError otherwise."""
    if args.draft_tokens < 1:
        raise UserError(f"--draft-tokens must be at least 1, got {args.draft_tokens}")
    if args.interactive or (args.num_beams or 1) > 1 or args.no_cache or args.compile:
        raise UserError("--draft (speculative decoding) works with one-shot greedy or sampled generation using the "
                        "KV cache; drop it, or drop --interactive / --num-beams / --no-cache / --compile")
    if args.draft in PROMPT_LOOKUP_NAMES:
        return args.draft
    if args.draft in MTP_NAMES:
        if getattr(model, "mtp", None) is None:
            raise UserError(f"--draft mtp drafts with the model's multi-token prediction depths (model.mtp in its spec), "
                            f"and {args.checkpoint} has none; use --draft ngram (prompt lookup) or --draft CKPT "
                            f"(a smaller checkpoint with the same tokenizer)")
        return args.draft
    if not Path(args.draft).is_file():
        raise UserError(f"--draft must be ngram (prompt lookup), mtp (the model's multi-token prediction depths) or a "
                        f"draft checkpoint file; {args.draft!r} is none of them")
    draft = specformer.load(args.draft, device=device).eval()
    if draft.vocab_size != model.vocab_size:
        raise UserError(f"the draft checkpoint {args.draft} has a vocabulary of {draft.vocab_size} tokens, the model "
                        f"{model.vocab_size}; a draft model must use the same tokenizer and vocabulary")
    theirs = checkpoint_tokenizer(read_metadata(args.draft), vocab_size=draft.vocab_size, where=args.draft,
                                  override=args.tokenizer, ids_only=True)
    if json.loads(theirs.to_json()) != json.loads(tokenizer.to_json()):  # as data: formatting does not count
        raise UserError(f"the draft checkpoint {args.draft} stores a different tokenizer than {args.checkpoint}; "
                        f"a draft model must use the same tokenizer and vocabulary")
    return draft


def _quantize(model: Any, scheme: str, *, keep_lm_head_float: bool) -> None:
    """``--quantize``: the model's weights quantized in place by the quantization plugin (an untied LM head too,
    the plugin's default, unless ``--keep-lm-head-float``)."""
    try:
        from specformer_quant import quantize  # late: the quantization plugin is optional here
    except ImportError:
        raise UserError("--quantize needs the specformer_quant plugin, which is not installed") from None
    if getattr(model, "quantization", None):
        raise UserError("--quantize: the checkpoint is already quantized; drop --quantize")
    try:
        quantize(model, scheme, quantize_lm_head=False if keep_lm_head_float else None)
    except ValueError as exc:  # SpecError for an unknown scheme; a width int4's group size does not divide
        raise UserError(f"--quantize {scheme}: {exc}") from None


def _as_chat(prompt: Prompt, template: ChatFormat, tokenizer: Tokenizer, *, vocab_size: int) -> Prompt:
    """``prompt`` as the one user message of a conversation, with the assistant's turn opened."""
    assert prompt.text is not None  # chat_format refuses --ids
    rendered = template.prompt([{"role": "user", "content": prompt.text}])
    return Prompt(text=prompt.text, ids=encode(rendered, tokenizer, ids_mode=False, where=template.where,
                                               vocab_size=vocab_size).ids)


def _generate_with_stops(model: Any, ids: list[list[int]], settings: dict[str, Any], tokenizer: Tokenizer,
                         stops: list[str], printer: "_StreamPrinter | None", turn_end: Any = None) -> list[list[int]]:
    """Stream the batch, ending each row at its first stop string; the new tokens of each row."""
    news: list[list[int]] = [[] for _ in ids]
    done = [False] * len(ids)
    for column in stream(model, ids, pad_token_id=-1, **settings):
        for row, token in enumerate(column):
            if done[row] or token < 0:
                continue
            news[row].append(token)
            if (stops or turn_end is not None) and continuation_text(tokenizer, news[row], stops, turn_end)[1]:
                done[row] = True
        if printer is not None:
            printer.update(news[0], stops, turn_end)
        if all(done):
            break
    if printer is not None:
        printer.finish(news[0], stops, turn_end)
    return news


def _print_results(prompts: list[Prompt], news: list[list[int]], tokenizer: Tokenizer, stops: list[str],
                   turn_end: Any = None, *, reply_only: bool = False) -> None:
    for i, (prompt, new) in enumerate(zip(prompts, news)):
        if i:
            print()
        if prompt.text is None:
            print(" ".join(map(str, prompt.ids + new)))
        else:
            print(("" if reply_only else prompt.text) + continuation_text(tokenizer, new, stops, turn_end)[0])


class _StreamPrinter:
    """Print text as tokens arrive; a multi-byte character cut in two, or what may begin an end-of-turn marker,
    waits for the tokens that settle it."""

    def __init__(self, prompt: Prompt, tokenizer: Tokenizer, *, reply_only: bool = False) -> None:
        self.tokenizer = tokenizer
        self.ids_mode = prompt.text is None
        self.shown = ""
        self.count = 0
        if not reply_only:
            sys.stdout.write(" ".join(map(str, prompt.ids)) if self.ids_mode else (prompt.text or ""))
        sys.stdout.flush()

    def update(self, new: list[int], stops: list[str], turn_end: Any = None) -> None:
        if self.ids_mode:
            sys.stdout.write("".join(f" {t}" for t in new[self.count:]))
            self.count = len(new)
        else:
            text, _ = shown_so_far(self.tokenizer, new, stops, turn_end)
            if not text.startswith(self.shown):
                return
            sys.stdout.write(text[len(self.shown):])
            self.shown = text
        sys.stdout.flush()

    def finish(self, new: list[int], stops: list[str], turn_end: Any = None) -> None:
        if self.ids_mode:
            self.update(new, stops)
            sys.stdout.write("\n")
        else:
            text, _ = continuation_text(self.tokenizer, new, stops, turn_end)
            sys.stdout.write(text[len(self.shown):] + "\n")
        sys.stdout.flush()


def parse_sampler_option(text: str) -> Sampler:
    """``--sampler``: a file or inline YAML/JSON naming a sampler list; UserError when it is not one."""
    path = Path(text)
    try:
        looks_like_file = path.suffix.lower() in (".yaml", ".yml", ".json") or path.is_file()
    except (OSError, ValueError):  # inline text too long, or with a NUL, to be a file name
        looks_like_file = False
    # Read within the core's bounds (size, nesting, YAML alias expansion, UTF-8): a sampler file is untrusted input.
    if looks_like_file:
        if not path.exists():
            raise UserError(f"--sampler {text}: no such file")
        try:
            data = parse_text(read_text(path, what="sampler file"), "YAML")  # YAML reads JSON too
        except InputError as exc:
            raise UserError(f"--sampler {exc}") from None
    else:
        try:
            data = parse_text(text, "YAML")
        except InputError as exc:
            raise UserError(f"--sampler is neither a file nor valid inline YAML/JSON: {exc}") from None
    if isinstance(data, dict) and "generate" in data:
        data = data["generate"] or {}
    if isinstance(data, dict) and "sampler" in data and "kind" not in data:
        data = data["sampler"]
    if isinstance(data, (str, dict)):
        data = [data]  # one component: `--sampler greedy`, `--sampler '{kind: top_k, k: 5}'`
    if not isinstance(data, list):
        raise UserError(
            f"--sampler must give a list of sampler components such as '[{{kind: top_k, k: 40}}, greedy]', "
            f"got {type(data).__name__} {excerpt(data)}"
        )
    try:
        return build_sampler(data, path="--sampler")
    except SpecError as exc:
        raise UserError("bad --sampler:\n" + "\n".join(f"  {p}" for p in exc.problems)) from None


#: The constraint flags and the sampler entry each one adds.
_CONSTRAINT_FLAGS = (("json_schema", "--json-schema"), ("regex", "--regex"), ("grammar", "--grammar"),
                     ("choice", "--choice"))


def with_constraint(args: argparse.Namespace, sampler: Sampler, *, tokenizer: Tokenizer, vocab_size: int,
                    eos: list[int] | None) -> Sampler:
    """``sampler`` with the constraint a flag asks for put first; every constraint checked against the tokenizer.

    A constraint in the spec's or ``--sampler``'s list is checked here too, so that a
    checkpoint without a tokenizer, or a run without an end-of-sequence id, is refused
    before anything is generated.
    """
    flag = next(((kind, name) for kind, name in _CONSTRAINT_FLAGS if getattr(args, kind, None) is not None), None)
    if flag is not None:
        kind, name = flag
        value = getattr(args, kind)
        if kind == "regex":
            entry: dict[str, Any] = {"kind": "regex", "pattern": value}
        elif kind == "choice":
            entry = {"kind": "choice", "options": value.split(",")}
        elif kind == "json_schema":
            entry = {"kind": "json_schema", "schema": value}
        else:
            try:
                entry = {"kind": "grammar", "lark": read_text(Path(value), what="grammar file")}
            except (InputError, OSError) as exc:
                raise UserError(f"--grammar {value}: {exc}") from None
        try:
            built = build_sampler([entry], path=name)
            # First, before the list's own steps; greedy stays greedy.
            sampler = Sampler([*built.steps, *sampler.steps], greedy_default=sampler.greedy_default)
        except SpecError as exc:
            raise UserError(f"bad {name}: " + "; ".join(p.message for p in exc.problems)) from None
        except ValueError as exc:  # a second constraint in the sampler list
            raise UserError(f"{name}: {exc}") from None
    if not sampler.constrained:
        return sampler
    if args.interactive:
        raise UserError("a constraint (--json-schema, --regex, --grammar, --choice or one in the sampler list) works "
                        "with one-shot generation, not chat yet; drop it or --interactive")
    try:
        sampler.for_run(tokenizer=tokenizer, vocab_size=vocab_size, eos=eos or [], prompt_width=0)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return sampler


def new_token_budget(requested: int | None, *, default: int, prompt_length: int, model: Any) -> int:
    """How many tokens to generate after a prompt of ``prompt_length`` tokens.

    Within the model's context, always. Past it as the model's positional schemes allow
    (``Decoder.past_context``, the policy of ``generate()`` and the forward): "yes" silently,
    "warn" with one note, "no" never: then an explicit ``--max-new-tokens`` that does not
    fit, or a prompt that fills the context, is an error that says the limit. The default
    (the spec's ``generate.max_new_tokens``, else 128) is a wish, not an order: it is cut to
    what the context leaves, with a note on stderr, so that the plain ``specformer generate
    CKPT --prompt TEXT`` stays within the trained context on a model of any length.
    """
    context = model.context_length
    room = context - prompt_length
    verdict, scheme = model.past_context() if callable(getattr(model, "past_context", None)) else ("no", None)
    wanted = requested if requested is not None else (default if room < 1 else min(default, room))
    if prompt_length + wanted > context:
        if verdict == "no":
            why = f" (its {type(scheme).__name__} has no position past it)" if scheme is not None else ""
            if room < 1:
                raise UserError(f"the prompt is {prompt_length} tokens long, but the model's context is {context} tokens"
                                f"{why} and at least one must be left to generate; shorten the prompt to at most "
                                f"{context - 1} tokens")
            raise UserError(f"--prompt ({prompt_length} tokens) plus --max-new-tokens {requested} exceeds the model's "
                            f"context of {context} tokens{why}; use --max-new-tokens {room} or less")
        if verdict == "warn":
            print(f"note: generating {prompt_length + wanted} tokens, past the model's {context}-token context: its "
                  f"positions ({type(scheme).__name__}) were never trained there, so quality may drop", file=sys.stderr)
            model._warned_past_context = True  # generate()'s own warning would say the same again
        return wanted
    if requested is None and default > room:
        print(f"note: generating at most {room} new tokens: the prompt's {prompt_length} tokens leave {room} of the "
              f"model's {context}-token context (default {default}; set --max-new-tokens to choose)", file=sys.stderr)
    return wanted


