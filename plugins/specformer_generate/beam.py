"""Beam search: keep the ``num_beams`` likeliest continuations of each prompt.

The same search as Hugging Face transformers' (vectorised, fixed shapes), so the two
agree token for token:

* each step scores every (beam, next token) pair by its summed log-probability and
  keeps the best ``K = max(2, 1 + n_end) * num_beams`` (``n_end``: eos ids plus stop
  sequences), enough that ``num_beams`` of them are still running even if the best
  ones all ended;
* a candidate that ends (eos, stop sequence, or the last step) and is among the top
  ``num_beams`` enters the finished set with score ``sum log p / length **
  length_penalty`` (``length`` = tokens generated, the end token included); the
  finished set keeps the ``num_beams`` best;
* ``early_stopping``: ``True`` stops a prompt once ``num_beams`` beams finished;
  ``False`` once the best running beam, scored at its current length, cannot beat the
  worst finished one; ``"never"`` scores it at the longest length it could reach (when
  ``length_penalty > 0``), which only stops when no beam can improve.

The sampler's processors (repetition penalties, n-gram bans...) are applied to the
log-probabilities before scoring; its draw is not used. Stopping needs one look at the
device per step.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from specformer_generate.cache import StaticKVCache
from specformer_generate.decode import cache_capacity, prefill, recompute, step_function
from specformer_generate.inputs import PromptBatch
from specformer_generate.samplers.pipeline import Sampler
from specformer_generate.stopping import StopCondition

#: Added to scores that must not be chosen (float32-safe, matching transformers' constant).
EXCLUDED = -1.0e9


def beam_search(
    model: Any,
    batch: PromptBatch,
    *,
    max_new_tokens: int,
    num_beams: int,
    length_penalty: float,
    early_stopping: bool | str,
    sampler: Sampler | None,
    eos: Sequence[int],
    stop: Sequence[Sequence[int]],
    pad_token_id: int | None,
    use_cache: bool,
    compile: bool | str,
) -> "tuple[Tensor | list[list[int]], int]":
    """The best beam of each prompt (full sequence) and the number of tokens generated in them.

    Every setting is required: ``generate(num_beams=...)`` is the public entry and owns the defaults.
    """
    # generate() has checked the settings (specformer_generate.arguments) and calls this only for num_beams > 1.
    B, nb, width, n = batch.batch_size, num_beams, batch.width, max_new_tokens
    rows = batch.repeat_rows(nb)
    device = batch.tokens.device
    vocab = model.vocab_size
    keep = min(max(2, 1 + len(eos) + len(stop)) * nb, nb * vocab)
    ends = StopCondition(batch_size=B * keep, eos=eos, stop=stop, device=device)
    top_nb = torch.arange(keep, device=device) < nb  # (K,) candidates allowed into the finished set

    running = torch.full((B, nb, width + n), -1, dtype=torch.long, device=device)
    running[:, :, :width] = batch.marked()[:, None]
    running_scores = torch.zeros(B, nb, device=device)
    running_scores[:, 1:] = EXCLUDED  # only the first beam is live at the start: no duplicates
    finished = running.clone()
    finished_scores = torch.full((B, nb), EXCLUDED, device=device)
    finished_flag = torch.zeros(B, nb, dtype=torch.bool, device=device)
    finished_len = torch.zeros(B, nb, dtype=torch.long, device=device)
    improvable = torch.ones(B, 1, dtype=torch.bool, device=device)
    batch_offset = torch.arange(B, device=device)[:, None] * nb  # (B, 1)

    next_position = torch.tensor(rows.lengths, device=device)[:, None]  # (B*nb, 1)
    if use_cache:
        capacity = cache_capacity(width + n, context_length=model.context_length, compile=compile)
        cache = StaticKVCache.for_model(model, batch_size=B * nb, capacity=capacity)
        step_fn = step_function(compile)
        logits = prefill(model, rows.tokens, rows.positions, cache)
    else:
        positions = torch.cat((rows.positions, next_position + torch.arange(n, device=device)), dim=1)
        logits = recompute(model, rows.tokens, rows.positions)

    for step in range(n):
        column = width + step
        log_probs = torch.log_softmax(logits, dim=-1)  # (B*nb, V)
        if sampler is not None:
            log_probs = sampler.process(log_probs, running.view(B * nb, -1)[:, :column])
        totals = (log_probs.view(B, nb, -1) + running_scores[..., None]).view(B, -1)  # (B, nb*V)

        # Candidates: the best `keep` (beam, token) pairs over all beams of a prompt.
        top_scores, top_index = torch.topk(totals, keep, dim=-1)  # (B, K)
        parent = top_index // vocab
        candidates = _gather(running, parent)  # (B, K, W)
        candidates[:, :, column] = top_index % vocab
        ended = ends.hits(candidates.view(B * keep, -1), column).view(B, keep) | (step + 1 == n)

        # Running beams for the next step: the best candidates that did not end.
        alive_scores = top_scores + ended.float() * EXCLUDED
        chosen = torch.topk(alive_scores, nb, dim=-1).indices  # (B, nb)
        running = _gather(candidates, chosen)
        running_scores = alive_scores.gather(1, chosen)
        parents = parent.gather(1, chosen)

        # Finished beams: merge the candidates that just ended into the best `num_beams`.
        just_ended = ended & top_nb
        scored = top_scores / float(step + 1) ** length_penalty
        if early_stopping is True:
            scored = scored + finished_flag.all(dim=1, keepdim=True).float() * EXCLUDED
        scored = scored + (~improvable).float() * EXCLUDED
        scored = scored + (~just_ended).float() * EXCLUDED
        merged_scores = torch.cat((finished_scores, scored), dim=1)  # (B, nb + K)
        best = torch.topk(merged_scores, nb, dim=-1).indices
        finished = _gather(torch.cat((finished, candidates), dim=1), best)
        finished_scores = merged_scores.gather(1, best)
        finished_flag = torch.cat((finished_flag, just_ended), dim=1).gather(1, best)
        lengths_now = torch.full((B, keep), step + 1, dtype=torch.long, device=device)
        finished_len = torch.cat((finished_len, lengths_now), dim=1).gather(1, best)

        improvable = improvable & _can_improve(
            running_scores, finished_scores, finished_flag,
            length=n if (early_stopping == "never" and length_penalty > 0) else step + 1,
            length_penalty=length_penalty,
        )
        all_full = bool(finished_flag.all()) and early_stopping is True
        if not bool(improvable.any()) or all_full or bool(ended.all()):
            break

        source_rows = (parents + batch_offset).view(-1)  # (B*nb,) the row each new beam continues
        next_tokens = running[:, :, column].reshape(B * nb, 1)
        if use_cache:
            cache.reorder(source_rows)
            logits = step_fn(model, next_tokens, next_position, cache)
            next_position += 1
        else:
            tokens = running.view(B * nb, -1)[:, : column + 1].clamp(min=0)  # padding reads as id 0
            logits = recompute(model, tokens, positions[:, : column + 1])

    return _collect(batch, finished[:, 0], finished_len[:, 0], pad_token_id, eos)


def _gather(tensor: Tensor, index: Tensor) -> Tensor:
    """``tensor[b, index[b, j]]`` for every ``b, j``: ``(B, M, ...)`` by ``(B, J)`` -> ``(B, J, ...)``."""
    expanded = index.view(*index.shape, *([1] * (tensor.dim() - 2))).expand(*index.shape, *tensor.shape[2:])
    return tensor.gather(1, expanded)


def _can_improve(running_scores: Tensor, finished_scores: Tensor, finished_flag: Tensor, *,
                 length: int, length_penalty: float) -> Tensor:
    """``(B, 1)``: whether the best running beam, scored at ``length``, could still enter the finished set."""
    best_possible = running_scores[:, :1] / float(length) ** length_penalty
    worst_finished = finished_scores.min(dim=1, keepdim=True).values.expand_as(finished_flag)
    worst = torch.where(finished_flag, worst_finished, EXCLUDED)
    return (best_possible > worst).any(dim=-1, keepdim=True)


def _collect(batch: PromptBatch, best: Tensor, generated: Tensor, pad_token_id: int | None,
             eos: Sequence[int]) -> "tuple[Tensor | list[list[int]], int]":
    width = batch.width
    lengths = generated.tolist()
    produced = sum(lengths)
    if batch.from_tensor:
        pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else -1)
        new = best[:, width : width + max(lengths)].clone()
        columns = torch.arange(new.shape[1], device=new.device)
        new[columns >= generated[:, None]] = pad
        return torch.cat((batch.tokens, new), dim=1), produced
    return [best[row, width - p : width + g].tolist() for row, (p, g) in enumerate(zip(batch.lengths, lengths))], produced
