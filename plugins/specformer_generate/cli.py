"""``specformer generate CHECKPOINT --prompt TEXT``: continue a prompt with a saved model.

The tokenizer is the one stored in the checkpoint's header (the byte tokenizer when
none was stored); the defaults come from the spec's ``generate`` section, and flags
override them. The text goes to stdout, the speed to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

import specformer
from specformer.checkpoint import read_metadata
from specformer.datafile import parse_text, read_text
from specformer.errors import InputError, SpecError, UserError, excerpt
from specformer.tokenizer import Tokenizer, tokenizer_from_metadata
from specformer_generate.generate import generate, stream
from specformer_generate.samplers.pipeline import Sampler, build_sampler
from specformer_generate.section import GenerateSpec


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", help="a .safetensors checkpoint written by specformer (spec in its header)")
    parser.add_argument("--prompt", required=True, help="the text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="most tokens to generate (default: the spec's generate.max_new_tokens, else 128, "
                             "cut to what the context leaves after the prompt)")
    parser.add_argument("--sampler", default=None,
                        help="sampler list: a .yaml/.json file (a list, or a spec with generate.sampler) or inline "
                             "YAML/JSON such as '[{kind: top_k, k: 40}, {kind: temperature, value: 0.8}]' "
                             "(default: the spec's generate.sampler, else greedy)")
    parser.add_argument("--seed", type=int, default=None, help="seed for the sampling draws")
    parser.add_argument("--stream", action="store_true", help="print tokens as they are generated")
    parser.add_argument("--num-beams", type=int, default=None, help="beam search with this many beams")
    parser.add_argument("--length-penalty", type=float, default=None, help="beam search length penalty")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-text token")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole sequence every token (slow)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the one-token decode step")
    parser.add_argument("--device", default="cpu", help="device to run on: cpu, cuda, cuda:1, mps (default cpu)")


def run(args: argparse.Namespace) -> int:
    device = _device(args.device)
    tokenizer = tokenizer_from_metadata(read_metadata(args.checkpoint))
    model = specformer.load(args.checkpoint, device=device).eval()  # ours alone: no dropout while generating
    section = model.spec.section("generate") or GenerateSpec()

    sampler = parse_sampler_option(args.sampler) if args.sampler is not None else section.build_sampler()
    num_beams = args.num_beams if args.num_beams is not None else section.num_beams
    length_penalty = args.length_penalty if args.length_penalty is not None else section.length_penalty
    seed = args.seed if args.seed is not None else section.seed
    eos = None if args.ignore_eos else (section.eos_ids() or [tokenizer.eot_id])
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if num_beams < 1:
        raise UserError(f"--num-beams must be at least 1, got {num_beams}")
    if args.stream and num_beams > 1:
        raise UserError("--stream cannot show beam search (the best beam is only known at the end); drop one of them")
    prompt = encode_prompt(tokenizer, args.prompt, model=model)
    max_new_tokens = new_token_budget(args.max_new_tokens, default=section.max_new_tokens,
                                      prompt_length=len(prompt), context=model.context_length)

    settings: dict[str, Any] = dict(max_new_tokens=max_new_tokens, sampler=sampler, seed=seed, eos_token_id=eos,
                                    use_cache=not args.no_cache, compile=args.compile)
    start = time.perf_counter()
    if args.stream:
        produced = _print_stream(tokenizer, args.prompt, stream(model, [prompt], **settings))
    else:
        out = generate(model, [prompt], num_beams=num_beams, length_penalty=length_penalty,
                       early_stopping=section.early_stopping, **settings)
        new = out[0][len(prompt):]
        produced = len(new)
        print(args.prompt + tokenizer.decode(new))
    seconds = time.perf_counter() - start
    print(f"{produced} tokens in {seconds:.2f} s ({produced / max(seconds, 1e-9):.1f} tokens/s)", file=sys.stderr)
    return 0


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


def encode_prompt(tokenizer: Tokenizer, text: str, *, model: Any) -> list[int]:
    """The prompt's ids, or a UserError when it is empty, too long, or not in the model's vocabulary."""
    if not text:
        raise UserError("--prompt is empty; give at least one character of text to continue")
    ids = tokenizer.encode(text)
    if not ids:
        raise UserError(f"--prompt {text!r} encodes to no tokens; give some text the tokenizer can encode")
    context = model.context_length
    if len(ids) >= context:
        raise UserError(
            f"--prompt is {len(ids)} tokens long, but the model's context is {context} tokens and at least one "
            f"must be left to generate; shorten the prompt to at most {context - 1} tokens"
        )
    outside = [i for i in ids if not 0 <= i < model.vocab_size]
    if outside:
        raise UserError(
            f"the checkpoint's tokenizer encodes the prompt to id {outside[0]}, outside the model's vocabulary of "
            f"{model.vocab_size}; the tokenizer does not belong to this model"
        )
    return ids


def new_token_budget(requested: int | None, *, default: int, prompt_length: int, context: int) -> int:
    """How many tokens to generate after a prompt of ``prompt_length`` tokens.

    An explicit ``--max-new-tokens`` that does not fit the context is an error that says
    the limit. The default (the spec's ``generate.max_new_tokens``, else 128) is a wish, not
    an order: it is cut to what the context leaves, with a note on stderr, so that the
    plain ``specformer generate CKPT --prompt TEXT`` works on a model of any context length.
    """
    room = context - prompt_length
    if requested is not None:
        if requested > room:
            raise UserError(
                f"--prompt ({prompt_length} tokens) plus --max-new-tokens {requested} exceeds the model's context of "
                f"{context} tokens; use --max-new-tokens {room} or less"
            )
        return requested
    if default > room:
        print(f"note: generating at most {room} new tokens: the prompt's {prompt_length} tokens leave {room} of the "
              f"model's {context}-token context (default {default}; set --max-new-tokens to choose)", file=sys.stderr)
        return room
    return default


def _print_stream(tokenizer: Tokenizer, prompt: str, columns: Any) -> int:
    """Print text as tokens arrive; a multi-byte character cut in two waits for its other half."""
    sys.stdout.write(prompt)
    sys.stdout.flush()
    ids: list[int] = []
    shown = ""
    for column in columns:
        ids.append(column[0])
        text = tokenizer.decode(ids)
        if text.endswith("\ufffd"):
            continue
        sys.stdout.write(text[len(shown):])
        sys.stdout.flush()
        shown = text
    sys.stdout.write(tokenizer.decode(ids)[len(shown):] + "\n")
    sys.stdout.flush()
    return len(ids)


def _device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"--device {name!r} is not a device name ({exc}); use cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name}: CUDA is not available on this machine; use --device cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"--device {name}: MPS is not available on this machine; use --device cpu")
    return device
