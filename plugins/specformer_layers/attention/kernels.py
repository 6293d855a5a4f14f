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

:func:`choose` is the one decision, over a call's :class:`Facts`: :func:`plan` gathers
the facts of a real call and :func:`attend` runs what it chose; :func:`describe` asks
:func:`choose` about the inputs a layer will typically meet and says what it answered
(``specformer summary`` prints it per layer), so the words cannot drift from the code.
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
from specformer_layers.attention.masking import attention_mask

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


@dataclass(frozen=True)
class Facts:
    """What decides the kernel of one call: the layer's score modifications and the call's input."""

    plain_causal: bool  # positions 0..T-1, no cache, no documents, no window or chunk shorter than the queries
    softcap: bool  # scores are soft-capped (the dense path is then eager: SDPA cannot cap)
    modified: bool  # soft-cap, sinks or a positional bias change the scores
    flex_blocked: str | None  # why FlexAttention cannot run this call (None: it can)
    flex_pays: bool  # enough scores that compiling FlexAttention pays (always on an accelerator)
    tiles_pay: Callable[[], bool]  # more than one tile, reading at most TILED_MAX_COVER (asked last: it builds tiles)
    dropout: bool = False
    observed: bool = False  # an observer wants the attention probabilities


@dataclass(frozen=True)
class Plan:
    """The kernel one call runs (``eager``, ``sdpa-causal``, ``sdpa``, ``flex``, ``tiled``) and its dense fallback."""

    kernel: str
    dense: str = "sdpa"  # the dense kernel of tiles, and where FlexAttention fails to compile
    fell_back: str | None = None  # why an explicit ``backend: flex`` could not run it (warned once)

    def describe(self) -> str:
        """The kernel in words, as ``specformer summary`` prints it."""
        if self.kernel == "tiled":
            return f"tiled {_WORDS[self.dense]}"
        return _WORDS[self.kernel]


_WORDS = {"eager": "eager", "sdpa-causal": "sdpa (fused causal)", "sdpa": "sdpa dense mask", "flex": "flex"}


def choose(backend: str, facts: Facts) -> Plan:
    """The one decision: which kernel runs a call of ``backend`` with these facts."""
    if backend == "eager" or facts.observed:
        return Plan("eager", dense="eager")
    if backend in ("auto", "sdpa") and facts.plain_causal and not facts.modified:
        return Plan("sdpa-causal")
    dense = "eager" if facts.softcap else "sdpa"
    if backend == "sdpa" or facts.dropout:
        return Plan(dense, dense=dense)  # FlexAttention has no dropout
    if backend == "flex":
        return Plan(dense, dense=dense, fell_back=facts.flex_blocked) if facts.flex_blocked else Plan("flex", dense=dense)
    if facts.flex_blocked is None and facts.flex_pays:  # auto
        return Plan("flex", dense=dense)
    return Plan("tiled" if facts.tiles_pay() else dense, dense=dense)


def plan(backend: str, *, ctx: ForwardContext, q: Tensor, k: Tensor, v: Tensor, k_positions: Tensor,
         rule: MaskRule, scores: Scores, dropout: float, observed: bool) -> Plan:
    """The kernel this call runs (:func:`choose` on the call's facts), without running it."""
    Tq, S = q.shape[2], k.shape[2]
    has_bias = scores.has_bias(ctx, k_positions)
    flex_blocked = flex.unavailable(q, k, v)
    if flex_blocked is None and has_bias and scores.score_bias() is None:
        flex_blocked = f"the positional scheme {type(scores.positional).__name__} has no per-score bias (score_bias)"
    facts = Facts(
        plain_causal=ctx.plain_causal and all(n is None or Tq <= n for n in (rule.window, rule.chunk)),
        softcap=scores.softcap is not None,
        modified=scores.softcap is not None or scores.sinks is not None or has_bias,
        flex_blocked=flex_blocked,
        flex_pays=q.device.type != "cpu" or Tq * S >= FLEX_MIN_SCORES,
        tiles_pay=lambda: Tq > tiled.TILE and tiled.covered(ctx, k_positions, rule) <= TILED_MAX_COVER,
        dropout=dropout > 0,
        observed=observed,
    )
    chosen = choose(backend, facts)
    if chosen.fell_back is not None and chosen.fell_back not in _warned:
        _warned.add(chosen.fell_back)
        warnings.warn(f"backend flex: {chosen.fell_back}; using SDPA with a dense mask", RuntimeWarning, stacklevel=4)
    return chosen


def attend(backend: str, *, ctx: ForwardContext, q: Tensor, k: Tensor, v: Tensor, k_positions: Tensor,
           rule: MaskRule, scores: Scores, dropout: float = 0.0,
           observe: Callable[[Tensor], None] | None = None) -> Tensor:
    """Attention output ``(B, H, Tq, vd)`` of ``q`` ``(B, H, Tq, hd)`` over ``k`` ``(B, KV, S, hd)``, ``v`` ``(B, KV, S, vd)``."""
    chosen = plan(backend, ctx=ctx, q=q, k=k, v=v, k_positions=k_positions, rule=rule, scores=scores,
                  dropout=dropout, observed=observe is not None)
    if chosen.kernel == "sdpa-causal":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout, scale=scores.scale,
                                              enable_gqa=k.shape[1] != q.shape[1])
    dense = eager if chosen.dense == "eager" else sdpa_dense
    if chosen.kernel == "flex":
        out = flex.flex_attention(q, k, v, ctx=ctx, k_positions=k_positions, rule=rule, scale=scores.scale,
                                  softcap=scores.softcap, sinks=scores.sinks,
                                  bias=scores.score_bias() if scores.has_bias(ctx, k_positions) else None)
        if out is not None:
            return out  # else it could not compile (warned once): the dense kernel
    elif chosen.kernel == "tiled":
        return tiled.tiled(q, k, v, ctx=ctx, k_positions=k_positions, rule=rule, bias=scores.bias,
                           kernel=lambda *qkv, mask, bias: dense(*qkv, mask=mask, bias=bias, scores=scores,
                                                                 dropout=dropout))
    mask = attention_mask(ctx, k_positions, rule)  # (B, 1, Tq, S) bool
    bias = scores.bias(ctx.positions, k_positions)
    if dense is eager:
        return eager(q, k, v, mask=mask, bias=bias, scores=scores, dropout=dropout, observe=observe)
    return sdpa_dense(q, k, v, mask=mask, bias=bias, scores=scores, dropout=dropout)


def check_bias_heads(bias: Tensor | None, heads: int, scores: Scores) -> None:
    """ValueError when a positional bias has other heads than the queries: tensor parallelism computes a layer on
    a share of its heads, and a scheme that biases each head (ALiBi, relative_bias) is one per model, not split."""
    if bias is not None and bias.shape[1] not in (1, heads):
        raise ValueError(f"the positional scheme {type(scores.positional).__name__} biases {bias.shape[1]} heads and "
                         f"this attention computes on {heads}: a per-head score bias is not split by tensor "
                         f"parallelism yet; train it without train.parallel.tp")


def sdpa_dense(q: Tensor, k: Tensor, v: Tensor, *, mask: Tensor, bias: Tensor | None, scores: Scores,
               dropout: float) -> Tensor:
    """SDPA with an explicit mask (a float one carrying the bias and sinks when there are any)."""
    H, KV = q.shape[1], k.shape[1]
    check_bias_heads(bias, H, scores)
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
    check_bias_heads(bias, q.shape[1], scores)
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


#: The inputs ``specformer summary`` describes a layer for, in the order it names them: a
#: plain prompt or training row on an accelerator; padded, packed or cached input there;
#: training on the CPU (plain rows, longer than the window), where FlexAttention has no backward.
SITUATIONS = (
    ("", dict(plain=True, flex_blocked=None)),
    ("padded, packed or cached input", dict(plain=False, flex_blocked=None)),
    ("CPU training", dict(plain=True, flex_blocked="FlexAttention has no backward on cpu")),
)


def situation_plans(*, backend: str, rule: MaskRule = MaskRule(), logit_softcap: float | None = None,
                    sinks: bool = False, bias: bool = False) -> list[tuple[str, Plan]]:
    """What :func:`choose` decides for a layer with these options in each of :data:`SITUATIONS`.

    Inputs are taken longer than the window and chunk; a windowed or chunked rule then
    skips most scores, a causal one never does (its triangle covers more than half).
    """
    limited = rule.window is not None or rule.chunk is not None
    modified = logit_softcap is not None or sinks or bias
    return [(label, choose(backend, Facts(plain_causal=s["plain"] and not limited, softcap=logit_softcap is not None,
                                          modified=modified, flex_blocked=s["flex_blocked"], flex_pays=True,
                                          tiles_pay=lambda: limited)))
            for label, s in SITUATIONS]


def describe(*, backend: str, rule: MaskRule = MaskRule(), logit_softcap: float | None = None, sinks: bool = False,
             bias: bool = False) -> str:
    """The kernel(s) a layer will run, in words (``specformer summary``): :func:`situation_plans` rendered.

    The first situation's kernel, then each other kernel with the situation that takes it.
    """
    said: list[str] = []
    parts: list[str] = []
    for label, chosen in situation_plans(backend=backend, rule=rule, logit_softcap=logit_softcap, sinks=sinks,
                                         bias=bias):
        words = chosen.describe()
        if words in said:
            continue
        said.append(words)
        if not label:
            parts.append(words)
        elif chosen.fell_back is not None:
            parts.append(f"{words} where flex cannot run ({label})")
        else:
            parts.append(f"{words} for {label}")
    return "; ".join(parts)
