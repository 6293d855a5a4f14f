"""Speculative decoding: a cheap drafter proposes ``k`` tokens, the model checks them all in one forward.

Each round the model reads its last token and the ``k`` drafts as one ``k + 1``-token
forward against the KV cache (one read of every weight instead of ``k + 1``), giving its
distribution at each of the ``k + 1`` next positions. Drafts are accepted from the left:

- greedy: while the draft equals the model's argmax; the first mismatch is replaced by
  the argmax, so the output is token for token that of plain greedy decoding;
- sampling (Leviathan et al. 2023, Chen et al. 2023): draft ``d`` drawn from the
  drafter's ``q`` is accepted with probability ``min(1, p(d) / q(d))``; the first
  rejected one is replaced by a draw from ``norm(max(0, p - q))``; when all ``k`` are
  accepted one more token is drawn from ``p``. Every emitted token then has exactly the
  model's distribution ``p`` (after the sampler's processors) given what precedes it.

A drafter that sets ``reads_hidden`` (the MTP drafter, self-speculative decoding) is handed
the model's last hidden state before the final norm at every column the model reads, from
the prefill and from each round's check (``Decoder.forward(return_hidden=True)``): the
columns it keeps are final, the rejected ones are written again next round.

A prompt-lookup drafter proposes a continuation copied from earlier in the text, which is
a ``q`` that puts all its mass on one token (acceptance probability ``p(d)``, residual
``p`` without ``d``).

Rows of a batch share cache columns, so a round keeps, for every row, as many tokens as
the row that accepted fewest (plus its replacement token); the other rows' extra accepted
drafts are dropped and drafted again. Each kept token is still one the model would have
emitted at that point (greedy: its argmax; sampling: a draw from ``p`` given the prefix),
so the result equals the row's own. The rejected columns are rolled back in the caches;
a sliding-window layer's ring keeps ``k`` spare slots so that rollback loses nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol

import torch
from torch import Tensor

from specformer_generate.cache import StaticKVCache
from specformer_generate.decode import prefill
from specformer_generate.inputs import PromptBatch
from specformer_generate.samplers.pipeline import Sampler

#: What ``draft=`` accepts as a name for prompt lookup.
PROMPT_LOOKUP_NAMES = ("ngram", "prompt_lookup")
#: What ``draft=`` accepts as a name for the model's own multi-token prediction depths.
MTP_NAMES = ("mtp",)


@dataclass
class Draft:
    """Proposed tokens of one round."""

    tokens: Tensor  # (B, k) proposed ids (any valid id where not ``valid``)
    valid: Tensor  # (B, k) bool: False where the drafter had nothing to propose (always rejected)
    probs: Tensor | None = None  # (B, k, V) the drafter's distribution for each token; None = all mass on it


class Drafter(Protocol):
    """Proposes continuations; told after each round how many history columns are final.

    A drafter with a true ``reads_hidden`` attribute also has ``read_hidden(hidden, column)``:
    the model's hidden state ``(B, T, D)`` (before the final norm) of columns ``column ..
    column + T - 1``, handed over after every forward of the model.
    """

    def start(self, batch: PromptBatch, *, capacity: int, spare: int) -> None: ...

    def propose(self, tokens: Tensor, history: Tensor, filled: int, k: int, *, offsets: Tensor, sampler: Sampler,
                generator: torch.Generator | None) -> Draft | None: ...

    def keep(self, columns: int) -> None: ...


# -- the loop -------------------------------------------------------------------------------


def speculative_decode(run: Any, drafter: Drafter, draft_tokens: int) -> Iterator[int]:
    """Like the plain loop: write each new column of tokens into ``run.history``, yield its step index.

    ``run`` is generate's ``_Run`` (model, batch, sampler, generator, stopper, history...).
    """
    model, batch, n, sampler = run.model, run.batch, run.max_new_tokens, run.sampler
    width, rows = batch.width, batch.batch_size
    device = batch.tokens.device
    # A column's position in a row is the column minus the row's left padding.
    offsets = (width - torch.tensor(batch.lengths, device=device))[:, None]  # (B, 1)
    capacity = width + n
    cache = StaticKVCache.for_model(model, batch_size=rows, capacity=capacity, spare=draft_tokens)
    reads_hidden = bool(getattr(drafter, "reads_hidden", False))
    drafter.start(batch, capacity=capacity, spare=draft_tokens)
    if reads_hidden:
        logits, hidden = model(batch.tokens, positions=batch.positions, cache=cache, last_only=True, return_hidden=True)
        logits = logits[:, -1].float()  # (B, V)
        drafter.read_hidden(hidden, 0)
    else:
        logits = prefill(model, batch.tokens, batch.positions, cache)
    cache.keep_steps = True  # a recurrent state can then go back to the last kept draft (not kept for the prompt)
    # What the models read: the raw ids (run.history holds the pad id after a row finished).
    tokens = torch.zeros((rows, capacity), dtype=torch.long, device=device)
    tokens[:, :width] = batch.tokens

    first = sampler.sample(logits, run.history[:, :width], run.generator)  # (B,)
    yield from _emit(run, tokens, first[:, None], width, 0)
    steps = 1
    while steps < n:
        filled = width + steps  # columns holding tokens; the model has read all but the last
        k = min(draft_tokens, n - steps - 1)  # never draft past the token budget
        draft = drafter.propose(tokens, run.history, filled, k, offsets=offsets, sampler=sampler,
                                generator=run.generator) if k else None
        k = 0 if draft is None else draft.tokens.shape[1]
        inputs = tokens[:, filled - 1 : filled]  # (B, 1)
        if draft is not None:
            inputs = torch.cat((inputs, draft.tokens), dim=1)  # (B, k + 1)
        columns = torch.arange(filled - 1, filled + k, device=device)  # (k + 1,)
        if reads_hidden:
            logits, hidden = model(inputs, positions=columns[None, :] - offsets, cache=cache, return_hidden=True)
            drafter.read_hidden(hidden, filled - 1)  # (B, k + 1, D): the drafts' columns are final only if kept
        else:
            logits = model(inputs, positions=columns[None, :] - offsets, cache=cache)
        logits = logits.float()  # (B, k + 1, V)
        accepted, emitted = verify(logits, draft, run.history, filled, sampler=sampler, generator=run.generator)
        running = ~run.stopper.done
        kept = int(accepted[running].min()) if bool(running.any()) else 0  # drafts kept in every row
        cache.rollback(filled + kept)  # the last token and the kept drafts stay
        drafter.keep(filled + kept)
        yield from _emit(run, tokens, emitted[:, : kept + 1], filled, steps)
        steps += kept + 1


def _emit(run: Any, tokens: Tensor, new: Tensor, column: int, step: int) -> Iterator[int]:
    """Write ``new`` ``(B, m)`` from ``column`` on (the pad id in finished rows), one step at a time."""
    for j in range(new.shape[1]):
        tokens[:, column + j] = new[:, j]
        run.history[:, column + j] = torch.where(run.stopper.done, run.pad, new[:, j])
        run.stopper.update(run.history, column + j, step + j)
        run.steps = step + j + 1
        yield step + j


def verify(logits: Tensor, draft: Draft | None, history: Tensor, filled: int, *, sampler: Sampler,
           generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Check a round's drafts against the model's ``logits`` ``(B, k + 1, V)``.

    Returns ``accepted`` ``(B,)``, how many drafts each row accepts, and ``emitted``
    ``(B, k + 1)``: for ``j < accepted`` the draft, at ``j = accepted`` the replacement
    (or, after ``k`` accepted drafts, the extra token). Later entries are meaningless.
    """
    rows, k = logits.shape[0], logits.shape[1] - 1
    context = history[:, : filled + k].clone()  # (B, filled + k): what the sampler reads at each position
    if draft is not None:
        context[:, filled:] = draft.tokens
    processed = torch.stack([sampler.process(logits[:, j], context[:, : filled + j]) for j in range(k + 1)], dim=1)
    if sampler.is_greedy:
        target = processed.argmax(dim=-1)  # (B, k + 1)
        if draft is None:
            return torch.zeros(rows, dtype=torch.long, device=logits.device), target
        ok = (draft.tokens == target[:, :k]) & draft.valid  # (B, k)
        return ok.long().cumprod(dim=1).sum(dim=1), target
    p = probabilities(processed)  # (B, k + 1, V)
    if draft is None:
        return torch.zeros(rows, dtype=torch.long, device=logits.device), sample_from(p, generator)
    q = draft.probs
    if q is None:  # all of the drafter's mass on its token
        q = torch.zeros_like(p[:, :k]).scatter_(-1, draft.tokens[..., None], 1.0)  # (B, k, V)
    q = q * draft.valid[..., None]  # nothing proposed: q = 0, so the "residual" is p itself
    p_draft = p[:, :k].gather(-1, draft.tokens[..., None])[..., 0]  # (B, k)
    q_draft = q.gather(-1, draft.tokens[..., None])[..., 0]  # (B, k)
    u = torch.rand((rows, k), generator=generator, device=logits.device)
    ok = draft.valid & (u * q_draft < p_draft)  # u < p(d) / q(d), without dividing by a zero
    accepted = ok.long().cumprod(dim=1).sum(dim=1)  # (B,)
    residual = (p[:, :k] - q).clamp(min=0)  # (B, k, V)
    # p <= q everywhere means p == q: then a rejection has probability 0; p keeps the draw defined.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p[:, :k])
    replacement = sample_from(torch.cat((residual, p[:, k:]), dim=1), generator)  # (B, k + 1)
    drafted = torch.cat((draft.tokens, replacement[:, k:]), dim=1)  # (B, k + 1)
    j = torch.arange(k + 1, device=logits.device)
    return accepted, torch.where(j[None, :] < accepted[:, None], drafted, replacement)


def probabilities(processed: Tensor) -> Tensor:
    """``softmax`` of processed logits ``(..., V)``, treated as :func:`~specformer_generate.samplers.pipeline.draw`
    treats them: NaN is impossible, and where a row has ``+inf`` logits those share all the mass."""
    processed = processed.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    certain = torch.isposinf(processed)
    processed = torch.where(certain.any(dim=-1, keepdim=True), torch.where(certain, 0.0, float("-inf")), processed)
    return torch.softmax(processed, dim=-1)


def sample_from(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One index per row of ``probs`` ``(..., V)`` (unnormalised weights are fine), by the exponential race."""
    race = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / race).argmax(dim=-1)
