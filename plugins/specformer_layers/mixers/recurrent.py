"""What every recurrent mixer's forward does around its own computation, written once: :class:`RecurrentMixer`.

A recurrent mixer's forward is always the same five steps; only the fourth is the mixer's own:

1. packed documents (``document_ids``) are cut apart and run as a batch of fresh rows
   (:func:`~specformer_layers.mixers.documents.by_document`);
2. without a cache, the rows run from a fresh state (keeping any left padding out of it);
3. with one, the state before this forward is read from the cache;
4. the mixer runs (:meth:`RecurrentMixer.run`), from that state, padding kept out;
5. the state after it (and after each token, while the cache keeps steps) is written back.

Steps 3 and 5 are also :func:`with_state`, for a layer that keeps a state beside other work
(compressed attention pools its blocks into one while it attends over a window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.state import recurrent_cache

from specformer_layers.mixers.documents import by_document, leading_padding

Result = TypeVar("Result")


@dataclass(frozen=True)
class MixerRun:
    """What one :meth:`RecurrentMixer.run` gives: its output and the states after it."""

    out: Tensor  # (B, T, D)
    state: dict[str, Tensor]  # each declared state slot after the last token, (B, *shape)
    steps: dict[str, Tensor] | None = None  # each slot after every token, (B, T, *shape); only when asked for


def with_state(ctx: ForwardContext, layer: nn.Module,
               run: Callable[[dict[str, Tensor], bool], tuple[Result, dict[str, Tensor], dict[str, Tensor] | None]],
               *, part: str = "mixer") -> Result:
    """``run(state before, keep steps)`` between reading ``layer``'s state from ``ctx.cache`` and writing it back.

    ``run`` returns its result, the state after the forward and, when told to keep steps,
    the state after each token (None otherwise). TypeError naming the layer when the cache
    keeps no states (:func:`~specformer.model.state.recurrent_cache`). ``part``: which of the
    layer's parts ``layer`` is (``"ffn"`` for a feed-forward with a state; :data:`~specformer.model.state.STATE_PARTS`).
    """
    cache = recurrent_cache(ctx.cache, layer)
    layer_index = int(layer.layer_index)
    keep_steps = bool(cache.keep_steps)
    # A mixer does not name its part, so a cache written before feed-forwards kept states still serves it.
    named: dict[str, str] = {} if part == "mixer" else {"part": part}
    result, after, steps = run(cache.read_state(layer_index, ctx.positions, **named), keep_steps)
    cache.write_state(layer_index, after, steps=steps if keep_steps else None, **named)
    return result


class RecurrentMixer(nn.Module):
    """A token mixer that keeps a fixed-size state per sequence instead of keys per token.

    A subclass declares its ``state_slots``, ``layer_index`` and its heads where it has heads,
    and writes :meth:`run`; this class's :meth:`forward` keeps documents apart, padding out of
    the state and the cache up to date, the same way for every mixer. Nothing else needs
    declaring: a mixer with a state keeps nothing per token and reads no positions
    (:func:`~specformer.model.attention.cache_slots_of`, :func:`~specformer.model.state.uses_positions`).
    """

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        if ctx.document_ids is not None:  # packed documents: each starts from a fresh state
            return by_document(x, ctx.document_ids, lambda documents: self.run(documents).out)
        # Left padding (negative positions: a ragged batch recomputed without a cache, or any cached
        # forward) leaves the state as it was; plain causal positions have none to count.
        if ctx.cache is None:
            return self.run(x, padding=None if ctx.plain_causal else leading_padding(ctx.positions)).out

        def cached(before: dict[str, Tensor], keep_steps: bool) -> tuple[Tensor, dict[str, Tensor], dict[str, Tensor] | None]:
            done = self.run(x, state=before, padding=leading_padding(ctx.positions), steps=keep_steps)
            return done.out, done.state, done.steps

        return with_state(ctx, self, cached)

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The mixer on ``x`` ``(B, T, D)`` from ``state`` (None: fresh rows, zeros).

        ``padding`` ``(B,)``: how many tokens open each row as padding, which must leave the
        state as it was (None: none). ``steps``: also return the state after every token.
        A mixer picks its algorithm here (chunked for long inputs, token by token for a cached
        few); ``state`` is not None only in a cached forward.
        """
        raise NotImplementedError(f"{type(self).__name__} must define run()")


__all__ = ["MixerRun", "RecurrentMixer", "with_state"]
