"""``generate`` and ``stream``: sample continuations of a batch of prompts.

The loop is gpt-fast's: prefill the prompt into a static cache, then one small forward
per token. Nothing in it waits for the device except, every ``check_every`` tokens, the
question "has every row finished?" (asked only when there is an end-of-sequence id or a
stop sequence to finish on).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Sequence, Union

import torch
from torch import Tensor

from specformer.registry.discovery import get_plugin_manager
from specformer_generate import arguments, beam
from specformer_generate.cache import StaticKVCache
from specformer_generate.decode import cache_capacity, prefill, recompute, step_function
from specformer_generate.inputs import PromptBatch, prompt_batch
from specformer_generate.memory import check_generation_memory, estimate
from specformer_generate.options import GenerationOptions, takes_options
from specformer_generate.samplers.pipeline import Sampler, build_sampler
from specformer_generate.speculation_args import speculation_drafter
from specformer_generate.speculative import speculative_decode
from specformer_generate.stopping import StopCondition

#: A (B, T) tensor of token ids, or prompts as token lists of any lengths.
Prompts = Union[Tensor, Sequence[Sequence[int]]]


@dataclass
class _Run:
    """Everything one generation call shares between the loop and whoever consumes it."""

    model: Any
    batch: PromptBatch
    max_new_tokens: int
    sampler: Sampler
    generator: torch.Generator | None
    stopper: StopCondition
    pad: int
    use_cache: bool
    compile: bool | str
    history: Tensor  # (B, T + N): prompt (-1 on padding) then emitted tokens; what samplers read
    steps: int = 0  # tokens generated per row so far
    drafter: Any = None  # speculative decoding's drafter (specformer_generate.drafters), or None
    draft_tokens: int = 0  # tokens the drafter proposes a round; read only when there is a drafter


@takes_options(beams=True)
def generate(model: Any, input_ids: Prompts, options: GenerationOptions) -> Tensor | list[list[int]]:
    """Continue each prompt by up to ``max_new_tokens`` tokens; return the full sequences.

    ``input_ids``: a ``(B, T)`` tensor (returns a ``(B, T + n)`` tensor) or a list of token
    lists of any lengths (returns a list of lists; each prompt gives the tokens it would
    give alone). A row ends after a token of ``eos_token_id`` or a ``stop`` sequence; in a
    tensor result later columns hold ``pad_token_id``. ``num_beams > 1`` runs beam search.
    Every argument is checked first: a bad one is a ``ValueError``, a call that needs too
    much memory a ``MemoryLimitError``, before anything is allocated.
    """
    start = time.perf_counter()
    num_beams = arguments.positive_int("num_beams", options.num_beams)
    check_every = arguments.positive_int("check_every", options.check_every)
    length_penalty = arguments.finite_number("length_penalty", options.length_penalty)
    early_stopping = arguments.early_stopping(options.early_stopping)
    if num_beams > 1:
        if options.draft is not None:
            raise ValueError("draft= (speculative decoding) works with sampling and greedy decoding, not beam search; "
                             "drop num_beams or draft")
        batch, checked = _prepare(model, input_ids, options, num_beams=num_beams)
        _check_no_restart(model, batch, checked.max_new_tokens, use_cache=options.use_cache, what="beam search")
        with _inference(model):
            result, produced = beam.beam_search(
                model, batch, max_new_tokens=checked.max_new_tokens, num_beams=num_beams,
                length_penalty=length_penalty, early_stopping=early_stopping,
                sampler=None if options.sampler is None else checked.sampler, eos=checked.eos, stop=checked.stop,
                pad_token_id=options.pad_token_id, use_cache=options.use_cache, compile=options.compile,
            )
        _report(produced, time.perf_counter() - start)
        return result
    with _inference(model):
        run = _start(model, input_ids, options)
        for step in _decode(run):
            if (step + 1) % check_every == 0 and run.stopper.all_done():
                break
        result, produced = _collect(run)
    _report(produced, time.perf_counter() - start)
    return result


@takes_options(beams=False)
def stream(model: Any, input_ids: Prompts, options: GenerationOptions) -> Iterator[list[int]]:
    """Like :func:`generate`, but yield each new column of tokens as it is produced.

    Each item is a list with one token id per prompt; a row that already finished
    yields ``pad_token_id``. The stream ends once every row finished or after
    ``max_new_tokens`` items. Streaming reads every token back from the device.
    """
    start = time.perf_counter()
    produced = 0
    # The consumer runs between items, so inference mode is entered per step, not held.
    arguments.check_mode(model)
    try:
        with torch.inference_mode():
            run = _start(model, input_ids, options)
        steps = _decode(run)
        column = run.batch.width
        while True:
            with torch.inference_mode():
                step = next(steps, None)
            if step is None:
                return
            produced += int((run.stopper.finished_at >= step).sum())
            yield run.history[:, column + step].tolist()
            if run.stopper.all_done():
                return
    finally:
        _report(produced, time.perf_counter() - start)


# -- the loop -------------------------------------------------------------------------


def _decode(run: _Run) -> Iterator[int]:
    """Generate one column of tokens per iteration into ``run.history``; yield the step index."""
    if run.drafter is not None:
        yield from speculative_decode(run, run.drafter, run.draft_tokens)
        return
    model, batch, n = run.model, run.batch, run.max_new_tokens
    width = batch.width
    next_position = torch.tensor(batch.lengths, device=batch.tokens.device)[:, None]  # (B, 1)
    if run.use_cache:
        capacity = cache_capacity(width + n, context_length=model.context_length, compile=run.compile)
        cache = StaticKVCache.for_model(model, batch_size=batch.batch_size, capacity=capacity)
        step_fn = step_function(run.compile)
        logits = prefill(model, batch.tokens, batch.positions, cache)
        # Lengths at which the cached keys go stale (LongRoPE switching to its long factors).
        restarts = model.cache_restarts() if callable(getattr(model, "cache_restarts", None)) else set()
    else:
        # The model reads the raw draws (a finished row's pad may not be a valid id).
        tokens = torch.cat((batch.tokens, torch.zeros_like(run.history[:, width:])), dim=1)  # (B, T + N)
        offsets = torch.arange(n, device=batch.tokens.device)
        positions = torch.cat((batch.positions, next_position + offsets), dim=1)  # (B, T + N)
        logits = recompute(model, batch.tokens, batch.positions)
    for step in range(n):
        column = width + step
        drawn = run.sampler.sample(logits, run.history[:, :column], run.generator)  # (B,)
        run.history[:, column] = torch.where(run.stopper.done, run.pad, drawn)
        run.stopper.update(run.history, column, step)
        run.steps = step + 1
        yield step
        if step + 1 == n:
            return
        if run.use_cache and column in restarts:
            # The cache holds exactly `restart` columns and this token goes past them: encode the whole
            # sequence again with a fresh cache, as transformers' Phi-3 generate drops its cache there.
            cache.reset()
            so_far = torch.cat((batch.tokens, run.history[:, width:column + 1].clamp(0, model.vocab_size - 1)), dim=1)
            so_far[:, column] = drawn  # a finished row's pad is not a token; its output is never used
            positions_so_far = torch.cat((batch.positions, next_position + torch.arange(-step, 1, device=so_far.device)), 1)
            logits = prefill(model, so_far, positions_so_far, cache)
            next_position += 1
        elif run.use_cache:
            logits = step_fn(model, drawn[:, None], next_position, cache)
            next_position += 1
        else:
            tokens[:, column] = drawn
            logits = recompute(model, tokens[:, : column + 1], positions[:, : column + 1])


@dataclass
class _Checked:
    """generate()'s arguments once checked, in the form the loop uses."""

    max_new_tokens: int
    sampler: Sampler
    eos: list[int]
    stop: list[list[int]]
    pad: int
    seed: int | None


def _prepare(model: Any, input_ids: Any, options: GenerationOptions, *,
             num_beams: int = 1) -> tuple[PromptBatch, _Checked]:
    """Check every argument (a ValueError for the first bad one) and the memory the call needs."""
    use_cache = arguments.flag("use_cache", options.use_cache)
    arguments.compile_option(options.compile)
    batch = _batch(model, input_ids)
    eos = arguments.eos_ids(options.eos_token_id)
    # A constraint is bound to this call: the tokenizer, the ids it ends on, where generated tokens start.
    sampler = build_sampler(options.sampler).for_run(tokenizer=options.tokenizer, vocab_size=model.vocab_size,
                                                     eos=eos, prompt_width=batch.width)
    checked = _Checked(
        max_new_tokens=_check_budget(model, batch, options.max_new_tokens),
        sampler=sampler,
        eos=eos,
        stop=arguments.stop_sequences(options.stop),
        pad=arguments.pad_id(options.pad_token_id, eos),
        seed=arguments.seed(options.seed),
    )
    rows = batch.batch_size * num_beams
    candidates = 0
    if num_beams > 1:
        candidates = batch.batch_size * min(max(2, 1 + len(checked.eos) + len(checked.stop)) * num_beams,
                                            num_beams * model.vocab_size)
    need = estimate(model, rows=rows, width=batch.width, new_tokens=checked.max_new_tokens, candidates=candidates,
                    use_cache=use_cache)
    what = f"beam search with {num_beams} beams" if num_beams > 1 else f"generating for {rows} prompt(s)"
    check_generation_memory(need, device=batch.tokens.device, max_memory=options.max_memory, what=what)
    return batch, checked


def _start(model: Any, input_ids: Any, options: GenerationOptions) -> _Run:
    batch, checked = _prepare(model, input_ids, options)
    use_cache, compile = options.use_cache, options.compile
    device = batch.tokens.device
    stopper = StopCondition(batch_size=batch.batch_size, eos=checked.eos, stop=checked.stop, device=device)
    history = torch.full((batch.batch_size, batch.width + checked.max_new_tokens), -1, dtype=torch.long, device=device)
    history[:, : batch.width] = batch.marked()
    generator = torch.Generator(device=device).manual_seed(checked.seed) if checked.seed is not None else None
    drafter, draft_tokens = None, options.draft_tokens
    if options.draft is not None:
        _check_no_restart(model, batch, checked.max_new_tokens, use_cache=use_cache, what="speculative decoding")
        drafter = speculation_drafter(model, options.draft, sampler=checked.sampler, use_cache=use_cache,
                                      compile=compile, needed=batch.width + checked.max_new_tokens)
        draft_tokens = arguments.positive_int("draft_tokens", draft_tokens)
    return _Run(model=model, batch=batch, max_new_tokens=checked.max_new_tokens, sampler=checked.sampler,
                generator=generator, stopper=stopper, pad=checked.pad, use_cache=use_cache,
                compile=compile, history=history, drafter=drafter, draft_tokens=draft_tokens)


def _collect(run: _Run) -> "tuple[Tensor | list[list[int]], int]":
    """The full sequences, trimmed after each row's end; and the number of tokens produced."""
    batch, width = run.batch, run.batch.width
    ends = (run.stopper.finished_at.clamp(max=run.steps - 1) + 1).tolist()  # new tokens per row
    produced = sum(ends)
    if batch.from_tensor:
        return torch.cat((batch.tokens, run.history[:, width : width + max(ends)]), dim=1), produced
    rows = []
    for row, (length, end) in enumerate(zip(batch.lengths, ends)):
        rows.append(run.history[row, width - length : width + end].tolist())
    return rows, produced


# -- checks and small helpers -----------------------------------------------------------


def _check_no_restart(model: Any, batch: PromptBatch, max_new_tokens: int, *, use_cache: Any, what: str) -> None:
    """Refuse a cached beam search or speculative run that would cross a cache restart (LongRoPE reencode).

    Only the plain decode loop encodes the sequence again at the restart; the others would go on
    with stale keys and give other tokens than transformers.
    """
    restarts = model.cache_restarts() if use_cache and callable(getattr(model, "cache_restarts", None)) else set()
    crossed = sorted(r for r in restarts if batch.width <= r <= batch.width + max_new_tokens - 2)
    if crossed:
        raise ValueError(f"{what} would pass {crossed[0]} tokens, where this model's positions switch (longrope "
                         f"reencode) and the cached keys must be encoded again, which only greedy decoding and "
                         f"sampling do; use num_beams=1 and no draft, use_cache=False, or at most "
                         f"{crossed[0] - batch.width + 1} new tokens")


def _batch(model: Any, input_ids: Any) -> PromptBatch:
    device = next(model.parameters()).device
    return prompt_batch(input_ids, vocab_size=model.vocab_size, device=device)


def _check_budget(model: Any, batch: PromptBatch, max_new_tokens: int) -> int:
    """``max_new_tokens``, once checked to be a positive int that fits the context after the longest prompt."""
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    longest, context = max(batch.lengths), model.context_length
    if longest + max_new_tokens <= context:
        return max_new_tokens
    # Past the context: allowed where every positional scheme allows it (Decoder.past_context).
    verdict, scheme = model.past_context() if callable(getattr(model, "past_context", None)) else ("no", None)
    if verdict == "warn":
        if not getattr(model, "_warned_past_context", False):
            warnings.warn(f"generating {longest + max_new_tokens} tokens, past the model's context length of {context}: "
                          f"its positions ({type(scheme).__name__}) were never trained there, so quality may drop",
                          stacklevel=_user_stacklevel())
            model._warned_past_context = True  # once per model
        return max_new_tokens
    if verdict == "yes":
        return max_new_tokens
    why = f" (its {type(scheme).__name__} has no position past it)" if scheme is not None else ""
    if longest >= context:
        raise ValueError(
            f"the longest prompt is {longest} tokens, but the model's context length is {context} tokens{why} and "
            f"at least one must be left for a new token; shorten the prompt to at most {context - 1} tokens "
            f"(for example keep its last {context - 1})"
        )
    raise ValueError(
        f"the longest prompt ({longest} tokens) plus max_new_tokens ({max_new_tokens}) is "
        f"{longest + max_new_tokens} tokens, more than the model's context length of {context}{why}; "
        f"use max_new_tokens={context - longest} or less, or shorten the prompt"
    )


@contextlib.contextmanager
def _inference(model: Any) -> Iterator[None]:
    """No autograd for the call. The model's train/eval mode is left exactly as it is.

    Switching it here (``model.eval()`` then back) would race with any other thread using
    the same model: two concurrent calls on a model in training mode would each restore
    the mode the other one set. Generation therefore never writes module state; a model
    whose training mode would change its output (active dropout) is refused instead.
    """
    arguments.check_mode(model)
    with torch.inference_mode():
        yield




#: This package's folder (with the separator, so that no sibling folder matches): frames in it are ours.
_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


def _user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning raised by our caller point at the first frame outside this package.

    generate, beam search and stream reach the warning through different numbers of frames,
    so a fixed stacklevel would name one of our own files for some of them.
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame, level = frame.f_back, level + 1
    return level


def _report(tokens: int, seconds: float) -> None:
    get_plugin_manager().hook.specformer_on_generate_end(tokens=tokens, seconds=seconds)
