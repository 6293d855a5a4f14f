"""Sizes and costs of a spec'd model, computed from shapes on the ``meta`` device (no memory)."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from specformer.model.attention import cache_slots_of, heads_of, kv_source_of, reach_of
from specformer.model.state import layer_state_slots, state_slots_of
from specformer.model.decoder import Decoder
from specformer.messages import format_bytes  # the one size style: 576 B, 36.9 KiB
from specformer.model.positional import PositionalScheme
from specformer.model.residual import ResidualConnection, ResidualStream
from specformer.spec.check import estimate


@dataclass
class ModelSummary:
    """Parameter counts per component and the per-token costs of the model.

    Modules that use only part of their weights per token (mixture of experts) say so
    through an ``active_parameters()`` method; only those count towards FLOPs.
    FLOPs follow the convention of Kaplan et al. and PaLM's MFU appendix: a matmul
    with N weights costs 2N FLOPs per token forward; attention scores and the weighted
    sum cost ``2 * n_heads * (head_dim + v_head_dim) * T`` per layer per token (``4 * n_heads
    * head_dim * T`` when values are as wide as keys; an attention whose values differ, as
    latent attention's, declares ``v_head_dim``), with T the context length (or the window,
    for sliding-window layers). Training = 3 x forward: ``6N + 3 * attention``, which is the
    familiar ``6N + 12 * L * H * hd * T`` when values are as wide as keys and no layer slides.
    The KV cache per token is what one more token adds with every layer still growing;
    at full context a sliding-window layer holds only its window, a chunked layer only its chunk (a ring, as
    generate keeps it).
    A recurrent mixer (:mod:`specformer.model.state`) adds nothing per token: it keeps a state
    of fixed size per sequence (``state_elements_per_sequence``), and its recurrence costs the
    ``recurrent_flops_per_token`` it declares, whatever the context. A layer that reads another
    layer's keys and values (``kv_from``, cross-layer KV sharing) keeps none: it adds nothing
    to the cache, and ``kv_shared_layers`` counts such layers.
    A shared block (``model.shared_blocks``) counts its parameters once (the ``shared_blocks`` row)
    and its compute and cache once per use: its matmuls, attention and keys at every layer that runs it.
    """

    params: "OrderedDict[str, int]" = field(default_factory=OrderedDict)
    total: int = 0
    active: int = 0  # parameters one token uses (total less the experts it is not routed to)
    non_embedding: int = 0
    matmul_params: int = 0
    attention_flops_per_token: int = 0
    kv_elements_per_token: int = 0
    kv_elements_at_context: int = 0  # one sequence of context_length tokens, windowed layers capped
    state_elements_per_sequence: int = 0  # recurrent mixers' states: the same at any context
    kv_shared_layers: int = 0  # layers reading another layer's keys and values (no cache of their own)
    context_length: int = 0
    n_layers: int = 0
    # What each mixer will run: ("attention kernel" or "mixer kernel", its describe_kernel(), e.g.
    # "sdpa (fused causal); flex for ...") -> layers.
    attention_kernels: "OrderedDict[tuple[str, str], int]" = field(default_factory=OrderedDict)
    # The residual stream when it is not the default single one (its describe(), e.g. "mhc: 4 streams, ...").
    residual_stream: str | None = None

    @property
    def forward_flops_per_token(self) -> int:
        return 2 * self.matmul_params + self.attention_flops_per_token

    @property
    def train_flops_per_token(self) -> int:
        return 3 * self.forward_flops_per_token

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.float32) -> int:
        return self.kv_elements_per_token * torch.empty((), dtype=dtype).element_size()

    def kv_bytes_at_context(self, dtype: torch.dtype = torch.bfloat16) -> int:
        return self.kv_elements_at_context * torch.empty((), dtype=dtype).element_size()

    def state_bytes_per_sequence(self, dtype: torch.dtype = torch.float32) -> int:
        return self.state_elements_per_sequence * torch.empty((), dtype=dtype).element_size()

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": dict(self.params),
            "total_params": self.total,
            "active_params": self.active,
            "non_embedding_params": self.non_embedding,
            "forward_flops_per_token": self.forward_flops_per_token,
            "train_flops_per_token": self.train_flops_per_token,
            "kv_cache_bytes_per_token_fp32": self.kv_bytes_per_token(torch.float32),
            "kv_cache_bytes_per_token_bf16": self.kv_bytes_per_token(torch.bfloat16),
            "kv_cache_bytes_at_context_bf16": self.kv_bytes_at_context(torch.bfloat16),
            "state_bytes_per_sequence_fp32": self.state_bytes_per_sequence(torch.float32),
            "kv_shared_layers": self.kv_shared_layers,
            "context_length": self.context_length,
            **({"residual_stream": self.residual_stream} if self.residual_stream is not None else {}),
        }


def summarize(model_or_spec: Any) -> ModelSummary:
    """Summarise a built Decoder, or a spec (a file, dict or Spec; nothing is allocated).

    For a spec, the skeleton and one block per distinct layer are built on the meta
    device and each block counted once per layer that shares it
    (:func:`specformer.spec.check.estimate`), so a million-layer spec is as quick as a small one.
    """
    if isinstance(model_or_spec, Decoder):
        model = model_or_spec
        uses = Counter(name for name in model.shared_uses if name is not None)
        return _summarize(model, [(block, 1) for block in model.blocks], context_length=model.context_length,
                          shared_uses=[(model.shared_blocks[name], n) for name, n in uses.items()])
    shape = estimate(model_or_spec)
    return _summarize(shape.skeleton, shape.blocks, context_length=shape.skeleton.context_length,
                      shared_uses=shape.shared_uses, use_parts=shape.use_parts)


def _summarize(skeleton: Any, blocks: list[tuple[torch.nn.Module, int]], *, context_length: int,
               shared_uses: list[tuple[torch.nn.Module, int]] = (),
               use_parts: list[tuple[torch.nn.Module, int]] = ()) -> ModelSummary:
    """Counts from the Decoder's own parts (``skeleton``, blocks ignored) and ``blocks`` weighted by their counts;
    each shared block (in the skeleton's parameters once) costs compute and cache once per use (``shared_uses``)."""
    s = ModelSummary(context_length=context_length, n_layers=sum(count for _, count in blocks))
    groups: OrderedDict[str, int] = OrderedDict(
        (k, 0) for k in ("embedding", "embedding_norm", "positional", "mixer", "ffn", "block norms", "residual",
                         "final_norm", "lm_head")
    )
    for name, p in skeleton.named_parameters():
        top = name.split(".")[0]
        top = "lm_head" if top == "head_bias" else top  # a tied head's bias counts with the head
        if top != "blocks":
            groups[top] = groups.get(top, 0) + p.numel()
    for parts, count in use_parts:  # a spec's per-use weights of shared blocks (a built model's are the skeleton's)
        groups["shared_use_parts"] = groups.get("shared_use_parts", 0) + count * sum(p.numel() for p in parts.parameters())
    for block, count in blocks:
        residuals = {name for name, m in block.named_children() if isinstance(m, ResidualConnection)}
        for name, p in block.named_parameters():
            part = name.split(".")[0]
            # A block's gate of its per-layer input counts with the per-layer input part.
            key = (part if part in ("mixer", "ffn") else "residual" if part in residuals
                   else "per_layer_input" if part == "per_layer" else "block norms")
            groups.setdefault(key, 0)
            groups[key] += p.numel() * count
    s.params = OrderedDict((k, v) for k, v in groups.items() if v or k in ("embedding", "mixer", "ffn"))
    s.total = sum(groups.values())
    s.non_embedding = s.total - groups["embedding"] - groups["positional"]
    lm_head_matmul = skeleton.embedding.weight.numel() if skeleton.tie_embeddings else 0
    norm_params = groups["block norms"] + groups["final_norm"] + groups["embedding_norm"]
    # Sparse modules (mixture of experts) multiply each token by only some of their weights.
    in_blocks = {id(m) for m in skeleton.blocks.modules()} if hasattr(skeleton, "blocks") else set()
    parts = [(m, 1) for m in skeleton.modules() if id(m) not in in_blocks]
    parts += [(m, count) for block, count in blocks for m in block.modules()]
    inactive = sum(
        (sum(p.numel() for p in m.parameters()) - m.active_parameters()) * count
        for m, count in parts
        if callable(getattr(m, "active_parameters", None))
    )
    # The per-layer inputs' tables are looked up, not multiplied (positional tables are outside non_embedding already).
    per_layer = getattr(skeleton, "per_layer_input", None)
    lookups = sum(m.weight.numel() for m in (per_layer.modules() if per_layer is not None else ())
                  if isinstance(m, torch.nn.Embedding))
    # A shared block's weights are in non_embedding once; its matmuls run at every use, its norms are no matmul.
    shared_matmul = [(sum(p.numel() for n, p in block.named_parameters() if n.split(".")[0] in ("mixer", "ffn")),
                      sum(p.numel() for p in block.parameters()), count) for block, count in shared_uses]
    per_use = sum(matmul * count - whole for matmul, whole, count in shared_matmul)
    s.matmul_params = s.non_embedding - norm_params + lm_head_matmul - inactive - lookups + per_use
    s.active = s.total - inactive
    stream = getattr(skeleton, "residual", None)
    s.residual_stream = stream.describe() if isinstance(stream, ResidualStream) else None
    for block, count in [*blocks, *shared_uses]:
        attention = block.mixer
        kept = cache_slots_of(attention)  # what the layer declares it keeps per token (None: nothing)
        state = state_slots_of(attention)  # and per sequence (a recurrent mixer)
        reach = reach_of(attention)  # a sliding window or a chunk bounds what a layer reads and keeps
        span = context_length if reach is None else min(reach, context_length)
        heads = heads_of(attention)  # None: a mixer without heads (no mixer, a short convolution)
        if heads is not None and (kept is not None or state is None):  # softmax attention reads every key in its span
            value_dim = getattr(attention, "v_head_dim", heads.head_dim)  # latent attention's values are narrower
            # Sparse attention reads at most `keys_read` keys of its span, having scored all of them to choose.
            read = min(span, getattr(attention, "keys_read", None) or span)
            s.attention_flops_per_token += 2 * heads.n_heads * (heads.head_dim + value_dim) * read * count
            s.attention_flops_per_token += int(getattr(attention, "selection_flops_per_key", 0)) * span * count
        if state is not None:
            s.attention_flops_per_token += int(getattr(attention, "recurrent_flops_per_token", 0)) * count
        # The layer's whole state: its mixer's and a feed-forward's that keeps one (RWKV's channel-mix shift).
        layer_state = layer_state_slots(block)
        if layer_state is not None:
            s.state_elements_per_sequence += layer_state.elements_per_sequence * count
        if callable(getattr(attention, "describe_kernel", None)):
            # A recurrent mixer's kernel does not depend on a score bias.
            kernel = attention.describe_kernel(bias=_has_bias(skeleton)) if state is None else attention.describe_kernel()
            label = "attention kernel" if state is None else "mixer kernel"
            s.attention_kernels[(label, kernel)] = s.attention_kernels.get((label, kernel), 0) + count
        if kv_source_of(attention) is not None:
            s.kv_shared_layers += count
        s.kv_elements_per_token += (kept.elements_per_token if kept is not None else 0) * count
        s.kv_elements_at_context += (kept.elements_per_token if kept is not None else 0) * span * count
    return s


def _has_bias(skeleton: Any) -> bool:
    # A scheme that biases scores (ALiBi) takes attention off the plain causal kernel.
    scheme = getattr(skeleton, "positional", None)
    return scheme is not None and type(scheme).attention_bias is not PositionalScheme.attention_bias


def format_summary(s: ModelSummary, *, title: str = "") -> str:
    def human(n: float) -> str:
        for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
            if abs(n) >= scale:
                return f"{n / scale:.2f}{unit}"
        return f"{n:g}"

    rows = [(k, f"{v:,}", f"{100 * v / max(s.total, 1):.1f}%") for k, v in s.params.items()]
    rows.append(("total", f"{s.total:,}", "100.0%"))
    rows.append(("non-embedding", f"{s.non_embedding:,}", f"{100 * s.non_embedding / max(s.total, 1):.1f}%"))
    if s.active != s.total:
        rows.append(("active / token", f"{s.active:,}", f"{100 * s.active / max(s.total, 1):.1f}%"))
    width = max(len(r[0]) for r in rows)
    numw = max(len(r[1]) for r in rows)
    lines = [title] if title else []
    lines.append(f"{'component':<{width}}  {'params':>{numw}}  share")
    lines += [f"{a:<{width}}  {b:>{numw}}  {c:>6}" for a, b, c in rows]
    lines.append("")
    lines.append(f"context length                 {s.context_length:,}")
    lines.append(f"forward FLOPs / token          {human(s.forward_flops_per_token)}  (2N + attention)")
    lines.append(f"training FLOPs / token         {human(s.train_flops_per_token)}  (3 × forward: 6N + 3·attention)")
    lines.append(
        f"KV cache / token               {format_bytes(s.kv_bytes_per_token(torch.float32))} fp32, "
        f"{format_bytes(s.kv_bytes_per_token(torch.bfloat16))} bf16"
        + (f"  ({s.kv_shared_layers} of {s.n_layers} layers read another layer's keys and values: no cache of their own)"
           if s.kv_shared_layers else "")
    )
    lines.append(
        f"KV cache at full context       {format_bytes(s.kv_bytes_at_context(torch.bfloat16))} bf16 per sequence"
    )
    if s.state_elements_per_sequence:
        lines.append(
            f"recurrent state / sequence     {format_bytes(s.state_bytes_per_sequence(torch.float32))} fp32, "
            f"{format_bytes(s.state_bytes_per_sequence(torch.bfloat16))} bf16 (the same at any context)"
        )
    for (label, kernel), layers in s.attention_kernels.items():
        lines.append(f"{label:<31}{kernel}  ({layers} layer{'s' if layers != 1 else ''})")
    if s.residual_stream is not None:
        lines.append(f"{'residual stream':<31}{s.residual_stream}")
    return "\n".join(lines)
