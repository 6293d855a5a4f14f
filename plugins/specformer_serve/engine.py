"""The scheduler: continuous batching over a paged KV cache, on one thread of its own.

Requests join and leave the running batch at token boundaries. Each turn of the loop

1. drops the requests whose client went away (their blocks go back to the pool),
2. admits waiting requests, first come first served, while the batch has room
   (``max_batch`` rows) and the pool can hold every admitted request's worst case,
3. prefills each newly admitted request alone (its prompt, one forward) and draws its
   first token (and, when the request asks for them, reports every prompt token's
   log-probability from that same forward: OpenAI's ``echo`` with ``logprobs``),
4. runs one decode forward over every running request (one new token per row, each at
   its own position, each reading its own blocks) and draws each row's next token.

**Admission control.** A request may need ``prompt + max_tokens`` tokens of cache. It is
admitted only when the free blocks, less the blocks already promised to running
requests, cover that; blocks are then taken one at a time as it grows. So a running
request can always grow, nobody is ever evicted or corrupted, and a request that does not
fit yet waits in the queue (in order, so a large one is not starved by small ones). A
request that could never fit (more than the whole pool) is refused by :meth:`Engine.check`.

**Same result as alone.** Each request has its own sampler, its own token history and its
own ``torch.Generator`` (seeded from its ``seed``), and its row's logits are processed and
drawn alone, exactly as ``generate`` does for a batch of one; batching changes only which
other rows share the forward, which a causal, masked attention never reads.

Events go back to whoever submitted the request through its ``emit`` callback, called
on the engine's thread (the HTTP layer hands them to its event loop).
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from specformer_generate import Sampler
from specformer_serve.paged_cache import PagedKVCache

log = logging.getLogger("specformer.serve")

#: The most tokens (padded prompts) one prefill forward reads; newly admitted requests beyond it wait a forward.
PREFILL_TOKENS = 4096


@dataclass(frozen=True)
class TokenEvent:
    """One new token of a request, with its log-probability under the model and the likeliest alternatives."""

    token: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class PromptEvent:
    """The prompt's tokens with their log-probabilities under the model, read from the prefill forward.

    One entry per prompt token; the first has no logprob (nothing precedes it) and no alternatives.
    Sent once, before the first :class:`TokenEvent`, to requests that ask for ``prompt_logprobs``.
    """

    tokens: tuple[TokenEvent, ...]


@dataclass(frozen=True)
class EndEvent:
    """A request ended: ``"stop"`` (an end-of-sequence token), ``"length"`` (max tokens), ``"cancelled"`` or ``"error"``."""

    reason: str
    message: str = ""


@dataclass
class SequenceRequest:
    """One sequence to generate (an OpenAI request with ``n = 2`` is two of these)."""

    prompt: list[int]
    max_new_tokens: int
    sampler: Sampler
    emit: Callable[[Any], None]  # receives PromptEvent if asked, TokenEvents, then one EndEvent; on the engine thread
    seed: int | None = None
    eos: frozenset[int] = frozenset()
    logprobs: int | None = None  # None: none; k >= 0: the chosen token's and the k likeliest alternatives'
    prompt_logprobs: int | None = None  # the same for every prompt token (a PromptEvent); max_new_tokens may be 0


@dataclass
class _Sequence:
    """A request inside the engine: its blocks, its history and where it stands."""

    id: int
    request: SequenceRequest
    history: Tensor  # (1, P + N) prompt then emitted tokens, -1 beyond; what the sampler reads
    generator: torch.Generator | None
    need_blocks: int  # blocks for prompt + max_new_tokens: the most it can ever hold
    blocks: list[int] = field(default_factory=list)
    cached: int = 0  # tokens whose keys/values are in the cache
    last: int = -1  # the latest token emitted: the next decode step's input
    produced: int = 0  # tokens emitted
    cancelled: bool = False
    state_slot: int | None = None  # its row of the recurrent states, while running (a model with recurrent layers)

    @property
    def length(self) -> int:
        return len(self.request.prompt) + self.produced


class Handle:
    """What :meth:`Engine.submit` returns: ``cancel()`` ends the request and frees its blocks at the next turn."""

    def __init__(self, engine: "Engine", sequence: _Sequence) -> None:
        self._engine, self._sequence = engine, sequence

    def cancel(self) -> None:
        self._engine._cancel(self._sequence)


class Engine:
    """Continuous batching for one model; ``start()`` runs the loop on a daemon thread, ``stop()`` ends it."""

    def __init__(self, model: Any, *, max_batch: int = 16, num_blocks: int = 256, block_size: int = 16) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.max_batch = max_batch
        # One recurrent state slot per request the batch can hold (a model without recurrent layers gets none).
        self.cache = PagedKVCache.for_model(model, num_blocks=num_blocks, block_size=block_size, state_slots=max_batch)
        self.pool = self.cache.pool
        self.device = self.cache.device
        self.context_length: int = model.context_length
        self.vocab_size: int = model.vocab_size
        self._waiting: list[_Sequence] = []
        self._running: list[_Sequence] = []
        self._lock = threading.Condition()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._listeners: list[Callable[[], None]] = []
        self.steps = 0  # decode forwards run (for tests and stats)
        self.largest_batch = 0
        self.ended: dict[str, int] = {"stop": 0, "length": 0, "cancelled": 0, "error": 0}  # requests, by how they ended

    # -- outside the engine thread ------------------------------------------------------------

    def check(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """A ValueError saying why a request of this size can never run here (context or pool)."""
        if prompt_tokens < 1:
            raise ValueError("the prompt is empty; give at least one token")
        if max_new_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {max_new_tokens}")
        # A prompt that only gets scored (max_tokens 0, echo) may fill the context; any other leaves room for one.
        if prompt_tokens > self.context_length or (max_new_tokens > 0 and prompt_tokens == self.context_length):
            leave = "" if prompt_tokens > self.context_length else " and at least one must be left to generate"
            raise ValueError(f"the prompt is {prompt_tokens} tokens, but the model's context is {self.context_length} "
                             f"tokens{leave}")
        if prompt_tokens + max_new_tokens > self.context_length:
            raise ValueError(f"the prompt ({prompt_tokens} tokens) plus max_tokens ({max_new_tokens}) is "
                             f"{prompt_tokens + max_new_tokens} tokens, more than the model's context of "
                             f"{self.context_length}; use max_tokens <= {self.context_length - prompt_tokens}")
        capacity = self.pool.num_blocks * self.pool.block_size
        if self.pool.blocks_for(prompt_tokens + max_new_tokens) > self.pool.num_blocks:
            raise ValueError(f"the prompt plus max_tokens ({prompt_tokens + max_new_tokens} tokens) is more than this "
                             f"server's whole KV cache holds ({capacity} tokens, --max-tokens-in-flight); lower "
                             f"max_tokens")

    def room_after(self, prompt_tokens: int) -> int:
        """The most new tokens a prompt of this length can have: what the context and the whole cache leave."""
        return min(self.context_length, self.pool.num_blocks * self.pool.block_size) - prompt_tokens

    def submit(self, request: SequenceRequest) -> Handle:
        """Queue a request (checked with :meth:`check` first); it is admitted when there is room."""
        self.check(len(request.prompt), request.max_new_tokens)
        total = len(request.prompt) + request.max_new_tokens
        history = torch.full((1, total), -1, dtype=torch.long, device=self.device)
        history[0, : len(request.prompt)] = torch.tensor(request.prompt, dtype=torch.long)
        generator = None
        if request.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(request.seed)
        sequence = _Sequence(id=next(self._ids), request=request, history=history, generator=generator,
                             need_blocks=self.pool.blocks_for(total))
        with self._lock:
            if self._stopping:
                raise RuntimeError("the engine is stopped")
            self._waiting.append(sequence)
            self._lock.notify()
        return Handle(self, sequence)

    def _cancel(self, sequence: _Sequence) -> None:
        with self._lock:
            sequence.cancelled = True
            self._lock.notify()

    def stats(self) -> dict[str, int]:
        """Requests running and waiting, and blocks free / total (all free when idle: no leak)."""
        with self._lock:
            return {"running": len(self._running), "waiting": len(self._waiting), "free_blocks": self.pool.free,
                    "total_blocks": self.pool.num_blocks, "block_size": self.pool.block_size,
                    "decode_steps": self.steps, "largest_batch": self.largest_batch,
                    **{f"ended_{reason}": count for reason, count in self.ended.items()}}

    def start(self) -> "Engine":
        self._thread = threading.Thread(target=self._loop, name="specformer-serve-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    # -- the engine thread ------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._lock:
                while not self._stopping and not self._waiting and not self._running:
                    self._lock.wait()
                if self._stopping:
                    break
                self._drop_cancelled()
                admitted = self._admit()
            try:
                with torch.inference_mode():
                    for group in self._prefill_groups(admitted):
                        self._prefill(group)
                    if self._running:
                        self._decode_step(list(self._running))
            except Exception as exc:  # noqa: BLE001 - a failing forward ends its requests, never the server
                log.error("engine step failed:\n%s", traceback.format_exc())
                with self._lock:
                    for sequence in list(self._running):
                        self._finish(sequence, EndEvent("error", f"{type(exc).__name__}: {exc}"))
            self._step_done()
        with self._lock:
            for sequence in [*self._running, *self._waiting]:
                self._finish(sequence, EndEvent("error", "the server is shutting down"))
            self._waiting.clear()
        self._step_done()

    def add_step_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` on the engine thread after every turn (after that turn's events were emitted).

        The HTTP layer uses it to wake its event loop once per turn instead of once per token.
        """
        with self._lock:
            self._listeners.append(listener)

    def _step_done(self) -> None:
        for listener in list(self._listeners):
            try:
                listener()
            except Exception:  # noqa: BLE001 - a listener's failure must not stop the engine
                log.error("step listener failed:\n%s", traceback.format_exc())

    def _drop_cancelled(self) -> None:
        for sequence in [s for s in self._waiting if s.cancelled]:
            self._waiting.remove(sequence)
            self.ended["cancelled"] += 1
            sequence.request.emit(EndEvent("cancelled"))
        for sequence in [s for s in self._running if s.cancelled]:
            self._finish(sequence, EndEvent("cancelled"))

    def _admit(self) -> list[_Sequence]:
        """Waiting requests that fit now, in arrival order (the first that does not fit stops the scan)."""
        promised = sum(s.need_blocks - len(s.blocks) for s in self._running)
        admitted = []
        while self._waiting and len(self._running) < self.max_batch:
            head = self._waiting[0]
            if self.pool.free - promised < head.need_blocks:
                break
            promised += head.need_blocks
            self._running.append(self._waiting.pop(0))
            if self.cache.has_states:
                head.state_slot = self.cache.claim_state()  # zeroed: a fresh sequence
            admitted.append(head)
        return admitted

    def _finish(self, sequence: _Sequence, event: EndEvent) -> None:
        """Called with the lock held: the request leaves the batch, its blocks go back, its client hears the end."""
        if sequence in self._running:
            self._running.remove(sequence)
        self.cache.free(sequence.blocks)
        sequence.blocks = []
        if sequence.state_slot is not None:
            self.cache.release_state(sequence.state_slot)
            sequence.state_slot = None
        self.ended[event.reason] += 1
        sequence.request.emit(event)

    def _grow(self, sequence: _Sequence, tokens: int) -> None:
        """Take blocks until ``sequence`` can hold ``tokens`` tokens (admission promised them)."""
        while len(sequence.blocks) * self.pool.block_size < tokens:
            sequence.blocks.append(self.pool.allocate())

    def _prefill_groups(self, admitted: list[_Sequence]) -> list[list[_Sequence]]:
        """Newly admitted requests in groups read by one forward each: at most ``PREFILL_TOKENS`` padded tokens."""
        groups: list[list[_Sequence]] = []
        for sequence in admitted:
            group = groups[-1] if groups else None
            if group is not None:
                longest = max(len(sequence.request.prompt), *(len(s.request.prompt) for s in group))
                if longest * (len(group) + 1) <= PREFILL_TOKENS:
                    group.append(sequence)
                    continue
            groups.append([sequence])
        return groups

    def _prefill(self, group: list[_Sequence]) -> None:
        """Read the prompts of ``group`` into the cache in one forward (left-padded), and draw each first token."""
        prompts = [s.request.prompt for s in group]
        width = max(map(len, prompts))
        for sequence in group:
            self._grow(sequence, len(sequence.request.prompt))
        self.cache.plan([s.blocks for s in group], [0] * len(group), [len(p) for p in prompts],
                        state_rows=[s.state_slot for s in group] if self.cache.has_states else None)
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], dtype=torch.long, device=self.device)  # (B, P)
        positions = torch.tensor([[-1] * (width - len(p)) + list(range(len(p))) for p in prompts],
                                 device=self.device)  # (B, P); -1: padding
        scored = [s.request.prompt_logprobs is not None for s in group]
        # Every position's logits only when some request scores its prompt: (B, P, V) is large.
        every = self.model(ids, positions=positions, cache=self.cache, last_only=not any(scored))  # (B, P or 1, V)
        for row, sequence in enumerate(group):
            sequence.cached = len(sequence.request.prompt)
            if scored[row]:
                prompt = sequence.request.prompt
                sequence.request.emit(_prompt_event(prompt, every[row, width - len(prompt):],
                                                    sequence.request.prompt_logprobs))
        logits = every[:, -1].float()  # (B, V)
        drawing = [row for row, s in enumerate(group) if s.request.max_new_tokens > 0]
        if len(drawing) < len(group):
            with self._lock:  # a prompt only scored (max_tokens 0) ends here, drawing nothing
                for row, sequence in enumerate(group):
                    if row not in drawing:
                        self._finish(sequence, EndEvent("length"))
        if drawing:
            index = torch.tensor(drawing, device=self.device)
            self._emit_all([group[row] for row in drawing], logits.index_select(0, index))

    def _decode_step(self, rows: list[_Sequence]) -> None:
        """One token for every row in ``rows`` (requests already prefilled), in one forward."""
        if not rows:
            return
        for sequence in rows:
            self._grow(sequence, sequence.cached + 1)
        self.cache.plan([s.blocks for s in rows], [s.cached for s in rows], 1,
                        state_rows=[s.state_slot for s in rows] if self.cache.has_states else None)
        tokens = torch.tensor([s.last for s in rows], dtype=torch.long, device=self.device)[:, None]  # (B, 1)
        positions = torch.tensor([s.cached for s in rows], device=self.device)[:, None]  # (B, 1)
        logits = self.model(tokens, positions=positions, cache=self.cache)[:, -1].float()  # (B, V)
        self.steps += 1
        self.largest_batch = max(self.largest_batch, len(rows))
        for sequence in rows:
            sequence.cached += 1
        self._emit_all(rows, logits)

    def _emit_all(self, rows: list[_Sequence], logits: Tensor) -> None:
        """Each row's next token from its logits ``(B, V)``: plain argmax rows in one batched argmax (the same
        per row as alone), every other row drawn alone."""
        plain = [row for row, s in enumerate(rows) if _plain_argmax(s.request.sampler)]
        chosen: dict[int, int] = {}
        if plain:
            index = torch.tensor(plain, device=self.device)
            chosen = dict(zip(plain, logits.index_select(0, index).argmax(dim=-1).tolist()))
        for row, sequence in enumerate(rows):
            self._emit_next(sequence, logits[row : row + 1], chosen.get(row))

    def _emit_next(self, sequence: _Sequence, logits: Tensor, token: int | None = None) -> None:
        """Draw this row's next token from its logits ``(1, V)`` alone (unless ``token`` was chosen already);
        send it; end the request if it is done."""
        request = sequence.request
        if token is None:
            history = sequence.history[:, : sequence.length]  # (1, T)
            token = int(request.sampler.sample(logits, history, sequence.generator)[0])
        sequence.history[0, sequence.length] = token
        sequence.last = token
        sequence.produced += 1
        request.emit(_token_event(token, logits, request.logprobs))
        reason = None
        if token in request.eos:
            reason = "stop"
        elif sequence.produced >= request.max_new_tokens:
            reason = "length"
        if reason is not None:
            with self._lock:
                self._finish(sequence, EndEvent(reason))


def _plain_argmax(sampler: Sampler) -> bool:
    """Greedy decoding with no processor: the row's token is the argmax of its logits, batched or not."""
    return not sampler.steps and sampler.greedy_default


def _token_event(token: int, logits: Tensor, logprobs: int | None) -> TokenEvent:
    if logprobs is None:
        return TokenEvent(token)
    log_probs = torch.log_softmax(logits[0], dim=-1)  # (V,) under the model, before any sampler step
    top: tuple[tuple[int, float], ...] = ()
    if logprobs > 0:
        values, ids = log_probs.topk(min(logprobs, log_probs.numel()))
        top = tuple(zip(ids.tolist(), values.tolist()))
    return TokenEvent(token, float(log_probs[token]), top)


#: Prompt positions whose float32 log-softmax is taken at once: bounds the memory of scoring a long prompt.
PROMPT_SCORE_CHUNK = 512


def _prompt_event(prompt: list[int], logits: Tensor, logprobs: int) -> PromptEvent:
    """Each prompt token's logprob (and the ``logprobs`` likeliest alternatives) from the prefill's ``logits``
    ``(P, V)``: position ``i``'s logits predict token ``i + 1``, as in training's loss."""
    targets = torch.tensor(prompt[1:], dtype=torch.long, device=logits.device)  # (P - 1,)
    chosen: list[float] = []
    top_values: list[list[float]] = []
    top_ids: list[list[int]] = []
    for start in range(0, len(prompt) - 1, PROMPT_SCORE_CHUNK):
        end = min(start + PROMPT_SCORE_CHUNK, len(prompt) - 1)
        log_probs = torch.log_softmax(logits[start:end].float(), dim=-1)  # (C, V)
        chosen += log_probs.gather(1, targets[start:end, None])[:, 0].tolist()
        if logprobs > 0:
            values, ids = log_probs.topk(min(logprobs, log_probs.shape[-1]), dim=-1)  # (C, k)
            top_values += values.tolist()
            top_ids += ids.tolist()
    events = [TokenEvent(prompt[0])]
    for i, token in enumerate(prompt[1:]):
        top = tuple(zip(top_ids[i], top_values[i])) if logprobs > 0 else ()
        events.append(TokenEvent(token, chosen[i], top))
    return PromptEvent(tuple(events))
