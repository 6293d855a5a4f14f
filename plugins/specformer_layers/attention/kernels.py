"""The attention kernels and the one place that chooses between them.

Every kernel computes the same thing: ``softmax(scale * q k^T [soft-capped] + bias,
masked [, with sink logits in the normalisation]) v``, with the mask rule of
:mod:`specformer.model.masks`. They differ in what they materialise:

* ``eager``: the written-out softmax, a ``(B, H, Tq, S)`` score tensor. The reference
  (and the only path that can hand attention probabilities to an observer).
* ``sdpa``: PyTorch's ``scaled_dot_product_attention``; its fused causal kernel when the
  mask is plain causal, otherwise a dense ``(B, 1 or H, Tq, S)`` mask.
* ``flex``: FlexAttention (:mod:`.flex`): block-sparse, masks and score modifications
  applied per score, nothing of size ``Tq x S``.
* ``tiled`` (:mod:`.tiled`): the dense kernels on query tiles, each over the key range
  its rows may read: linear work and memory for windows and documents, no ``T x T``
  tensor, gradients as the dense path.
* ``auto`` (the default): ``sdpa``'s fused causal kernel where the mask is plain causal
  and nothing modifies scores; ``flex`` otherwise where it can run (on CUDA; on CPU only
  without gradients, PyTorch has no CPU backward for it, and only for masks of at least
  :data:`FLEX_MIN_SCORES` scores, below which compiling costs more than it saves); else
  ``tiled`` for inputs longer than one tile whose tiles skip more than half of the
  scores (:data:`TILED_MAX_COVER`), and the dense ``sdpa`` path (``eager`` when scores
  are soft-capped) otherwise.

:func:`plan` says which kernel a call will use, without running it (``specformer
summary`` prints it per layer); :func:`attend` runs it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule
from specformer.model.positional import PositionalScheme

from specformer_layers.attention import flex, tiled

BACKENDS = ("auto", "sdpa", "flex", "eager")

#: ``auto`` on CPU uses FlexAttention only for masks of at least this many scores (Tq x S).
FLEX_MIN_SCORES = 1 << 20

#: ``auto`` takes the tiled path only when its tiles read at most this share of the Tq x S scores.
TILED_MAX_COVER = 0.5

# Reasons already warned about (explicit ``backend: flex`` that had to fall back): one warning each.
_warned: set[str] = set()


@dataclass(frozen=True)
class Scores:
    """What modifies the scores of one layer: scale, soft-cap, sinks and the positional bias."""

    scale: float
    softcap: float | None = None
    sinks: Tensor | None = None  # (H,) sink logits
    positional: PositionalScheme | None = None
    state: Any = None

    def bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """The scheme's additive bias ``(B or 1, H, Tq, S)`` float32, or None."""
        if self.positional is None:
            return None
        return self.positional.attention_bias(q_positions, k_positions, self.state)

    def has_bias(self, ctx: ForwardContext, k_positions: Tensor) -> bool:
        if self.positional is None or type(self.positional).attention_bias is PositionalScheme.attention_bias:
            return False  # the base scheme's bias is always None: no slicing per layer and decode step
        # Asked on one (query, key) pair, so finding out never builds a Tq x S tensor.
        return self.bias(ctx.positions[:, :1], k_positions[:, :1]) is not None

    def score_bias(self) -> Callable[[Tensor, Tensor, Tensor], Tensor] | None:
        """The bias of single scores ``(q_position, k_position, head)`` when the scheme offers it.

        A scheme offers it with ``score_bias(q_position, k_position, head, state)``
        (elementwise, as ALiBi does); one with only ``attention_bias`` keeps the dense path.
        """
        method = getattr(self.positional, "score_bias", None)
        if method is None:
            return None
        return lambda qp, kp, head: method(qp, kp, head, self.state)


def plan(backend: str, *, ctx: ForwardContext, q: Tensor, k: Tensor, v: Tensor, k_positions: Tensor,
         rule: MaskRule, scores: Scores, dropout: float, observed: bool) -> str:
    """The kernel this call runs: ``eager``, ``sdpa-causal``, ``sdpa``, ``flex``, ``tiled``."""
    if backend == "eager" or observed:
        return "eager"
    Tq, S = q.shape[2], k.shape[2]
    limits_nothing = all(n is None or Tq <= n for n in (rule.window, rule.chunk))
    unmodified = scores.softcap is None and scores.sinks is None and not scores.has_bias(ctx, k_positions)
    if backend in ("auto", "sdpa") and ctx.plain_causal and limits_nothing and unmodified:
        return "sdpa-causal"
    dense = "eager" if scores.softcap is not None else "sdpa"
    if backend == "sdpa" or dropout > 0:
        return dense  # FlexAttention has no dropout
    why_not = flex.unavailable(q, k, v)
    if why_not is None and scores.score_bias() is None and scores.has_bias(ctx, k_positions):
        why_not = f"the positional scheme {type(scores.positional).__name__} has no per-score bias (score_bias)"
    if backend == "flex":
        if why_not is not None and why_not not in _warned:
            _warned.add(why_not)
            warnings.warn(f"backend flex: {why_not}; using SDPA with a dense mask", RuntimeWarning, stacklevel=4)
        return dense if why_not is not None else "flex"
    # auto
    if why_not is None and not (q.device.type == "cpu" and Tq * S < FLEX_MIN_SCORES):
        return "flex"
    return "tiled" if Tq > tiled.TILE else dense


def attend(backend: str, *, ctx: ForwardContext, q: Tensor, k: Tensor, v: Tensor, k_positions: Tensor,
           rule: MaskRule, scores: Scores, dropout: float = 0.0,
           observe: Callable[[Tensor], None] | None = None) -> Tensor:
    """Attention output ``(B, H, Tq, hd)`` of ``q`` ``(B, H, Tq, hd)`` over ``k``, ``v`` ``(B, KV, S, hd)``."""
    kernel = plan(backend, ctx=ctx, q=q, k=k, v=v, k_positions=k_positions, rule=rule, scores=scores,
                  dropout=dropout, observed=observe is not None)
    H, KV = q.shape[1], k.shape[1]
    if kernel == "sdpa-causal":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scores.scale,
                                              enable_gqa=KV != H)
    if kernel == "flex":
        out = flex.flex_attention(q, k, v, ctx=ctx, k_positions=k_positions, rule=rule, scale=scores.scale,
                                  softcap=scores.softcap, sinks=scores.sinks,
                                  bias=scores.score_bias() if scores.has_bias(ctx, k_positions) else None)
        if out is not None:
            return out
        kernel = "eager" if scores.softcap is not None else "sdpa"  # could not compile: warned once
    # chunk is passed only when set, so a context written before chunks existed still works.
    limits = {"window": rule.window} if rule.chunk is None else {"window": rule.window, "chunk": rule.chunk}
    if kernel == "tiled" and tiled.covered(ctx, k_positions, rule) > TILED_MAX_COVER:
        kernel = "eager" if scores.softcap is not None else "sdpa"  # the tiles would read most keys anyway
    if kernel == "tiled":
        dense = eager if scores.softcap is not None else sdpa_dense
        return tiled.tiled(q, k, v, ctx=ctx, k_positions=k_positions, rule=rule, bias=scores.bias,
                           kernel=lambda *qkv, mask, bias: dense(*qkv, mask=mask, bias=bias, scores=scores,
                                                                 dropout=dropout))
    mask = ctx.attention_mask(k_positions, **limits)  # (B, 1, Tq, S) bool
    bias = scores.bias(ctx.positions, k_positions)
    if kernel == "eager":
        return eager(q, k, v, mask=mask, bias=bias, scores=scores, dropout=dropout, observe=observe)
    return sdpa_dense(q, k, v, mask=mask, bias=bias, scores=scores, dropout=dropout)


def sdpa_dense(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor, bias: Tensor | None, scores: Scores,
               dropout: float) -> Tensor:
    """SDPA with an explicit mask (a float one carrying the bias and sinks when there are any)."""
    H, KV = q.shape[1], k.shape[1]
    attn_mask: Tensor = mask  # (B, 1, Tq, S) bool
    if bias is not None or scores.sinks is not None:
        # An additive float mask: the bias where allowed, -inf elsewhere. (B, 1 or H, Tq, S)
        attn_mask = torch.where(mask, 0.0 if bias is None else bias.to(q.dtype), float("-inf")).to(q.dtype)
    if scores.sinks is not None:
        # A sink is one more key whose score is the sink logit and whose value is zero: it
        # takes its share of the softmax and adds nothing to the output.
        B, _, Tq, hd = q.shape
        k = F.pad(k, (0, 0, 0, 1))  # (B, KV, S+1, hd), the last key zero
        v = F.pad(v, (0, 0, 0, 1))
        sink = scores.sinks.to(q.dtype)[None, :, None, None].expand(B, H, Tq, 1)  # (B, H, Tq, 1)
        attn_mask = torch.cat([attn_mask.expand(B, H, Tq, attn_mask.shape[-1]), sink], dim=-1)  # (B, H, Tq, S+1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=scores.scale,
                                          enable_gqa=KV != H)


def eager(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor, bias: Tensor | None, scores: Scores, dropout: float,
          observe: Callable[[Tensor], None] | None = None) -> Tensor:
    """The written-out softmax: the reference every other kernel is tested against."""
    group = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(group, dim=1)  # (B, H, S, hd)
    v = v.repeat_interleave(group, dim=1)
    logits = (q @ k.transpose(-2, -1)) * scores.scale  # (B, H, Tq, S)
    if scores.softcap is not None:
        logits = torch.tanh(logits / scores.softcap) * scores.softcap
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # the softmax (and any bias) in at least float32
    if bias is not None:
        logits = logits + bias
    logits = logits.masked_fill(~mask, float("-inf"))
    if scores.sinks is not None:
        # The sink logit joins the normalisation as one more column, then is dropped (gpt-oss).
        B, H, Tq, _ = logits.shape
        sink = scores.sinks.to(logits.dtype)[None, :, None, None].expand(B, H, Tq, 1)
        weights = torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, Tq, S)
    else:
        weights = torch.softmax(logits, dim=-1)
    # A query that may attend to no key at all would get 0/0 = NaN weights; give it zero
    # weights instead, as PyTorch's fused kernels do, so a NaN can never leave this layer.
    weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if observe is not None:
        observe(weights)
    weights = weights.to(q.dtype)
    weights = F.dropout(weights, p=dropout, training=dropout > 0)
    return weights @ v  # (B, H, Tq, hd)


def describe(*, backend: str, window: int | None = None, chunk: int | None = None,
             logit_softcap: float | None = None, sinks: bool = False, bias: bool = False) -> str:
    """The kernel(s) a layer will run, in words (``specformer summary``), without running it."""
    dense = "eager" if logit_softcap is not None else "sdpa dense mask"
    if backend == "eager":
        return "eager"
    plain = window is None and chunk is None and logit_softcap is None and not sinks and not bias
    if backend == "sdpa":
        return f"sdpa (fused causal); {dense} for padded, packed or cached input" if plain else dense
    if backend == "flex":
        return f"flex; {dense} where flex cannot run (CPU training)"
    if plain:
        return "sdpa (fused causal); flex for padded, packed or cached input"
    return f"flex; tiled {dense} for CPU training"
