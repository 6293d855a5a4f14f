"""FlexAttention (PyTorch's ``torch.nn.attention.flex_attention``): any mask, no T x T tensor.

The mask rule of :mod:`specformer.model.masks`, evaluated by :mod:`.masking`, becomes a block
mask (which ``128 x 128`` tiles to visit, which of them need the rule applied score by
score) and a ``mask_mod`` that applies it; ALiBi-style biases and soft-capping become a
``score_mod``, evaluated per score inside the kernel; an attention sink is one more
key, after the real ones, that every query may read, whose score the ``score_mod``
replaces by the head's sink logit and whose value is zero (so it only takes its share
of the normalisation). The block mask is built once per forward per rule and key tensor
(:func:`.masking.memo`), one row of tiles at a time, and shared by every layer with the
same rule.

The kernel must be compiled to be fused (otherwise PyTorch runs a reference
implementation that does materialise the scores). This module compiles it once per
shape bucket: lengths are padded up to a power of two (at least one tile) so a run
with many lengths compiles a handful of times. When compiling fails (no C compiler,
an unsupported platform) :func:`flex_attention` returns None after ONE warning and
the caller falls back to SDPA with a dense mask.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from specformer.model.context import ForwardContext
from specformer.model.masks import MaskRule

from specformer_layers.attention.masking import MaskInputs, allowed, block_summary, memo

try:  # PyTorch >= 2.5
    from torch.nn.attention.flex_attention import BlockMask
    from torch.nn.attention.flex_attention import flex_attention as _flex_attention
except ImportError:  # pragma: no cover - older PyTorch: the dispatcher never picks flex
    _flex_attention = None

#: Tile edge of the block mask (FlexAttention's default sparse block size).
BLOCK = 128

# Set after the first failed compile: every later call falls back without trying again.
_broken: str | None = None
_compiled: Callable[..., Any] | None = None


def unavailable(q: Tensor, k: Tensor, v: Tensor) -> str | None:
    """Why FlexAttention cannot run this call (a short reason), or None when it can."""
    if _flex_attention is None:
        return "this PyTorch has no torch.nn.attention.flex_attention"
    if _broken is not None:
        return _broken
    needs_grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if needs_grad and q.device.type in ("cpu", "mps"):
        return f"FlexAttention has no backward on {q.device.type} in PyTorch {torch.__version__}"
    return None


def bucket(length: int) -> int:
    """The padded length compiled for ``length``: a power of two, at least one tile."""
    return max(BLOCK, 1 << (length - 1).bit_length())


def flex_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    ctx: ForwardContext,
    k_positions: Tensor,
    rule: MaskRule,
    scale: float,
    softcap: float | None = None,
    bias: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None,
    sinks: Tensor | None = None,
) -> Tensor | None:
    """Attention output ``(B, H, Tq, hd)`` of ``q`` ``(B, H, Tq, hd)`` over ``k``, ``v`` ``(B, KV, S, hd)``.

    ``bias(q_position, k_position, head)`` is the positional scheme's additive bias of
    one score (evaluated inside the kernel, never as a tensor); ``sinks`` ``(H,)`` are
    per-head sink logits that join the softmax normalisation. None when the kernel
    could not be compiled (after one warning): the caller takes its dense path.
    """
    global _broken
    B, H, Tq, hd = q.shape
    S = k.shape[2]
    # With sinks, key slot S (the first padded one) is the sink.
    Tq_pad, S_pad = bucket(Tq), bucket(S + (sinks is not None))
    sink_slot = S if sinks is not None else None
    block_mask = memo(ctx, ("flex", rule, Tq_pad, S_pad, sink_slot), k_positions,
                      lambda inputs: _block_mask(inputs, rule, Tq_pad, S_pad, sink_slot))
    score_mod = _score_mod(block_mask, softcap=softcap, bias=bias, sinks=sinks, sink_slot=sink_slot, device=q.device)
    q = F.pad(q, (0, 0, 0, Tq_pad - Tq))  # (B, H, Tq_pad, hd)
    k = F.pad(k, (0, 0, 0, S_pad - S))  # (B, KV, S_pad, hd), zero keys and values past S
    v = F.pad(v, (0, 0, 0, S_pad - S))
    try:
        out = _kernel()(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=k.shape[1] != H)
    except Exception as error:  # noqa: BLE001 - any compiler failure means: use the dense path
        if torch.compiler.is_compiling():
            raise
        _broken = f"FlexAttention could not be compiled ({type(error).__name__}: {str(error).splitlines()[0][:200]})"
        warnings.warn(f"{_broken}; attention falls back to SDPA with a dense mask", RuntimeWarning, stacklevel=2)
        return None
    return out[:, :, :Tq]  # (B, H, Tq, hd)


def _kernel() -> Callable[..., Any]:
    global _compiled
    if torch.compiler.is_compiling():
        return _flex_attention  # an enclosing torch.compile traces it into its own graph
    if _compiled is None:
        compiled = torch.compile(_flex_attention, dynamic=False)

        def call(*args: Any, **kwargs: Any) -> Any:
            # Each shape bucket and mask/score variant is one compiled graph; allow enough of them.
            with torch._dynamo.config.patch(recompile_limit=64):
                return compiled(*args, **kwargs)

        _compiled = call
    return _compiled


def _padded(inputs: MaskInputs, Tq_pad: int, S_pad: int) -> MaskInputs:
    """The inputs extended to the padded lengths: padded keys are never read, padded queries are dropped."""

    def pad(t: Tensor | None, length: int) -> Tensor | None:
        return None if t is None else F.pad(t, (0, length - t.shape[1]), value=-1)

    return MaskInputs(pad(inputs.q_order, Tq_pad), pad(inputs.k_order, S_pad),
                      pad(inputs.q_positions, Tq_pad), pad(inputs.k_positions, S_pad),
                      pad(inputs.q_documents, Tq_pad), pad(inputs.k_documents, S_pad))


def _block_mask(inputs: MaskInputs, rule: MaskRule, Tq_pad: int, S_pad: int, sink_slot: int | None) -> "BlockMask":
    inputs = _padded(inputs, Tq_pad, S_pad)
    some, every = block_summary(inputs, rule, block=BLOCK)  # (B, n_q_blocks, n_k_blocks)
    if sink_slot is not None:
        some[:, :, sink_slot // BLOCK] = True  # every query reads the sink
    partial = some & ~every  # tiles where the rule is applied score by score

    def ordered(tiles: Tensor) -> tuple[Tensor, Tensor]:
        # Per row of tiles: how many to visit and their column indices, visited ones first.
        tiles = tiles[:, None].to(torch.int32)  # (B, 1, n_q_blocks, n_k_blocks)
        count = tiles.sum(dim=-1).to(torch.int32)
        order = torch.argsort(tiles, dim=-1, descending=True, stable=True).to(torch.int32)
        return count.contiguous(), order.contiguous()

    rule_tensors = _rule_tensors(rule, inputs.q_order.device)
    qo, ko, qp, kp, qd, kd = (inputs.q_order, inputs.k_order, inputs.q_positions, inputs.k_positions,
                              inputs.q_documents, inputs.k_documents)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        ok = allowed(qo[b, q_idx], ko[b, kv_idx], qp[b, q_idx], kp[b, kv_idx],
                     None if qd is None else qd[b, q_idx], None if kd is None else kd[b, kv_idx], rule_tensors)
        return ok if sink_slot is None else ok | (kv_idx == sink_slot)

    block_mask = BlockMask.from_kv_blocks(*ordered(partial), *ordered(every), BLOCK_SIZE=BLOCK,
                                          mask_mod=mask_mod, seq_lengths=(Tq_pad, S_pad))
    block_mask.positions = (qp, kp)  # what score_mod reads for position biases
    return block_mask


def _rule_tensors(rule: MaskRule, device: torch.device) -> MaskRule:
    # The window and chunk as tensors: the compiled kernel reads them as inputs, so layers
    # with different windows share one compiled graph instead of one each.
    as_tensor = lambda n: None if n is None else torch.tensor(n, device=device)  # noqa: E731
    return MaskRule(window=as_tensor(rule.window), chunk=as_tensor(rule.chunk))


def _score_mod(
    block_mask: "BlockMask", *, softcap: float | None, bias: Callable[[Tensor, Tensor, Tensor], Tensor] | None,
    sinks: Tensor | None, sink_slot: int | None, device: torch.device,
) -> Callable[..., Tensor] | None:
    if softcap is None and bias is None and sinks is None:
        return None
    qp, kp = block_mask.positions
    cap = None if softcap is None else torch.tensor(softcap, device=device, dtype=torch.float32)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        if cap is not None:
            score = torch.tanh(score / cap) * cap
        if bias is not None:
            score = score + bias(qp[b, q_idx], kp[b, kv_idx], h)  # the scheme's bias of this one score
        if sinks is not None:
            score = torch.where(kv_idx == sink_slot, sinks[h].to(score.dtype), score)
        return score

    return score_mod
