"""The Decoder: embed -> (embedding norm) -> positional -> blocks -> final norm -> LM head.

A plain ``nn.Module``. It knows no concrete component: the builder hands it a
positional scheme, a list of blocks (each built by a layout component from an
attention, an ffn and norms), the residual stream the blocks are joined to
(:mod:`specformer.model.residual`: expanded after the embeddings, collapsed before the
final norm), a final norm and, for some models, a norm on the token embeddings.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import replace
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.attention import AttentionLayer, cache_slots_of, kv_source_of
from specformer.model.context import ForwardContext, KVCache, default_positions
from specformer.model.head_bias import TiedHeadBias
from specformer.model.masks import check_document_ids
from specformer.model.positional import PositionalScheme
from specformer.model.residual import ResidualStream
from specformer.model.shared import SharedUse, UseParts, attach_adapter_hooks, use_context
from specformer.model.state import layer_state_slots


class Decoder(nn.Module):
    """A decoder-only transformer language model.

    ``model(input_ids)`` returns logits ``(B, T, vocab_size)``. A generator passes
    ``positions`` (absolute, ``(B, T)``, negative for padding) and a ``cache`` holding
    the keys and values of earlier tokens.
    """

    def __init__(
        self,
        *,
        vocab_size: int,
        padded_vocab_size: int,
        d_model: int,
        context_length: int,
        positional: PositionalScheme,
        blocks: list[nn.Module],
        layer_positionals: list[PositionalScheme] = (),
        layer_scheme: list[int] | None = None,
        final_norm: nn.Module,
        embedding_norm: nn.Module | None = None,
        residual: ResidualStream | None = None,
        tie_embeddings: bool = True,
        lm_head_bias: bool = False,
        embedding_multiplier: float = 1.0,
        logit_softcap: float | None = None,
        logit_scale: float = 1.0,
        embedding_dropout: float = 0.0,
        per_layer_input: nn.Module | None = None,
        mtp: list[nn.Module] = (),
        mtp_loss_weights: "list[float] | tuple[float, ...]" = (),
        shared_blocks: dict[str, nn.Module] | None = None,
        shared_uses: list[str | None] | None = None,
        shared_options: dict[str, Any] | None = None,
        spec: Any = None,
    ) -> None:
        super().__init__()
        if padded_vocab_size < vocab_size:
            raise ValueError(f"padded_vocab_size {padded_vocab_size} is smaller than vocab_size {vocab_size}")
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.context_length = context_length
        self.embedding = nn.Embedding(padded_vocab_size, d_model)
        self.positional = positional
        # Schemes inside attention that differ from ``positional`` (model.layers[].positional),
        # one module per distinct scheme; layer i uses [positional, *layer_positionals][layer_scheme[i]].
        self.layer_positionals = nn.ModuleList(layer_positionals)
        if layer_scheme is not None and len(layer_scheme) != len(blocks):
            raise ValueError(f"layer_scheme names {len(layer_scheme)} layers, the model has {len(blocks)}")
        if layer_scheme is not None and not all(0 <= i <= len(layer_positionals) for i in layer_scheme):
            raise ValueError(f"layer_scheme indices must be 0..{len(layer_positionals)} (0: the model-level scheme)")
        self.layer_scheme = list(layer_scheme) if layer_scheme is not None else None
        self.blocks = nn.ModuleList(blocks)
        # Layers whose keys and values later layers read (their kv_from): each forward keeps those for them.
        self.kv_sources = sorted({s for b in blocks if (s := kv_source_of(getattr(b, "mixer", None))) is not None})
        self.final_norm = final_norm
        # A norm on the token embeddings (BLOOM, nanochat); None: the embeddings enter the blocks as they are.
        self.embedding_norm = embedding_norm
        # The residual stream's own weights (hyper-connections' head); the blocks hold their connections.
        self.residual = residual if residual is not None else ResidualStream()
        self.lm_head = None if tie_embeddings else nn.Linear(d_model, padded_vocab_size, bias=lm_head_bias)
        # A tied head's bias (CTRL): the head shares the embedding's weight, the bias is its own.
        self.head_bias = TiedHeadBias(rows=padded_vocab_size) if lm_head_bias and tie_embeddings else None
        self.embedding_multiplier = embedding_multiplier
        self.logit_softcap = logit_softcap
        self.logit_scale = logit_scale
        self.embedding_dropout = nn.Dropout(embedding_dropout)
        # Per-layer inputs (model.per_layer_input): computed once per forward, each block reads its slice from ctx.
        self.per_layer_input = per_layer_input
        # Multi-token prediction depths (model.mtp, :mod:`specformer.model.mtp`): run only when a forward asks
        # (with_mtp); None, and no state_dict key, for a model without them.
        if len(mtp_loss_weights) != len(mtp):
            raise ValueError(f"mtp_loss_weights gives {len(mtp_loss_weights)} weights for {len(mtp)} MTP depths")
        self.mtp = nn.ModuleList(mtp) if len(mtp) else None
        self.mtp_loss_weights = [float(w) for w in mtp_loss_weights]
        # Blocks whose weights several layers use (model.shared_blocks), stored once here; shared_uses[i] names the
        # one run before block i. Each use keeps its own cache slot, n_layers + k for the k-th use
        # (specformer.model.shared).
        self.shared_blocks = nn.ModuleDict(shared_blocks or {})
        uses = list(shared_uses) if shared_uses is not None else [None] * len(blocks)
        if len(uses) != len(blocks) or not set(uses) - {None} <= set(self.shared_blocks):
            raise ValueError(f"shared_uses must name one of the shared blocks {sorted(self.shared_blocks)} or None "
                             f"for each of the {len(blocks)} layers, got {uses}")
        self.shared_uses = tuple(uses)  # fixed: the cache slots below are numbered from it
        self._use_slots = {i: len(blocks) + k for k, i in enumerate(i for i, name in enumerate(uses) if name is not None)}
        # What each use has of its own (a shared block's output, projection, adapters: model.shared_blocks.<name>),
        # shared_use_parts[str(layer)] for a use that has weights; the adapters reach the shared block through hooks.
        options = shared_options or {}
        self._shared_output = {name: getattr(options.get(name), "output", "stream") for name in self.shared_blocks}
        self._shared_input = {name: getattr(options.get(name), "input", "stream") for name in self.shared_blocks}
        self.shared_use_parts = nn.ModuleDict({
            str(i): UseParts(d_model=d_model, projection=options[name].projection, adapters=options[name].adapters)
            for i, name in enumerate(uses)
            if name is not None and name in options and (options[name].projection or options[name].adapters)})
        self._adapter_hooks = {name: attach_adapter_hooks(self.shared_blocks[name], options[name].adapters, name=name)
                               for name in self.shared_blocks if name in options and options[name].adapters}
        for i, name in enumerate(uses):
            if name is not None and self._shared_output[name] == "mixer_input" \
                    and not getattr(blocks[i], "accepts_mixer_addend", False):
                raise ValueError(f"layer {i} runs shared block {name!r}, whose output goes to the mixer input, but its "
                                 f"layout ({type(blocks[i]).__name__}) takes no mixer input addend; use layout prenorm")
        self._check_first_cached()
        self.spec = spec

    @property
    def tie_embeddings(self) -> bool:
        return self.lm_head is None

    def forward(
        self,
        input_ids: Tensor,
        *,
        positions: Tensor | None = None,
        document_ids: Tensor | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
        with_mtp: bool = False,
        return_hidden: bool = False,
    ) -> "Tensor | tuple[Tensor, list[Tensor]] | tuple[Tensor, Tensor]":
        """Logits ``(B, T, vocab_size)``, or ``(B, 1, vocab_size)`` for the last token with ``last_only``.

        ``return_hidden``: ``(logits, hidden)``, ``hidden`` ``(B, T, d_model)`` the last hidden state
        of every position (the residual stream collapsed, before the final norm: what MTP depth 1
        reads), whatever ``last_only`` says of the logits. Not with ``with_mtp``.

        ``with_mtp`` (a model with ``model.mtp``, no cache): ``(logits, mtp_logits)``, where
        ``mtp_logits[k - 1]`` ``(B, T - k, vocab_size)`` are depth k's logits, row i predicting
        token ``i + k + 1`` (:meth:`mtp_logits`). Without it the MTP depths do not run.

        ``document_ids`` ``(B, T)`` (integers, packed training): a token attends only to
        earlier tokens of its own document. Without a cache, attention is causal by
        column, so ``positions`` restarting per document never reach a later token.

        A sequence longer than ``context_length`` runs where every positional scheme allows
        it (:meth:`check_past_context`), as generation does; learned positions refuse it.
        """
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, time), got shape {tuple(input_ids.shape)}")
        if with_mtp and (self.mtp is None or cache is not None or last_only):
            raise ValueError("with_mtp needs a model with MTP depths (model.mtp) and a forward over whole sequences "
                             "(no cache, no last_only); " + ("this model has none" if self.mtp is None else
                                                              "give neither cache nor last_only"))
        if with_mtp and return_hidden:
            raise ValueError("give with_mtp or return_hidden, not both (with_mtp computes the MTP logits from the "
                             "hidden state itself)")
        batch, length = input_ids.shape
        if document_ids is not None:
            check_document_ids(document_ids, input_ids, cache=cache)
        plain_causal = positions is None and cache is None and document_ids is None
        if positions is None:
            if cache is not None:
                raise ValueError("a forward with a cache needs the absolute positions of its tokens")
            if length > self.context_length:
                self.check_past_context(length)
            positions = default_positions(batch, length, device=input_ids.device)

        x = self.embedding(input_ids)  # (B, T, D)
        if self.embedding_multiplier != 1.0:
            # Gemma scales in the activation dtype; the multiplier is rounded to it the same way.
            x = x * torch.tensor(self.embedding_multiplier, dtype=x.dtype)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        per_layer = self.per_layer_input(input_ids, x) if self.per_layer_input is not None else None  # (B, T, L, P)
        added = self.positional.embed(positions)
        if added is not None:
            x = x + added.to(x.dtype)  # schemes compute in float32; the stream keeps its dtype
        x = self.embedding_dropout(x)
        x = self.residual.expand(x)  # (B, T, D), or wider for a multi-stream residual

        ctx = self._context(positions, cache=cache, plain_causal=plain_causal)
        ctx.document_ids = document_ids
        ctx.token_ids = input_ids
        ctx.shared_kv = dict.fromkeys(self.kv_sources)
        ctx.per_layer_inputs = per_layer
        embedded = x  # what a shared block with input concat_embeddings reads beside the stream
        for index, block in enumerate(self.blocks):
            if self.shared_uses[index] is not None:
                x, addend = self._shared_use(index, x, ctx, embedded=embedded)
                if addend is not None:
                    # A context of this block's own (the dicts inside still shared): a recomputing wrapper
                    # (activation checkpointing) reruns the block later with the addend it ran with.
                    x = block(x, replace(ctx, mixer_addend=addend))
                    continue
            x = block(x, ctx)
        hidden = self.residual.collapse(x) if return_hidden else None  # (B, T, D): all positions, before last_only
        if last_only:
            x = x[:, -1:, :]
        logits = self.head_logits(x)
        if hidden is not None:
            return logits, hidden
        if not with_mtp:
            return logits
        return logits, self.mtp_logits(self.residual.collapse(x), input_ids, positions=positions,
                                       document_ids=document_ids, plain_causal=plain_causal)

    def mtp_logits(self, hidden: Tensor, input_ids: Tensor, *, positions: Tensor, document_ids: Tensor | None = None,
                   plain_causal: bool = False) -> list[Tensor]:
        """Each MTP depth's logits from the main model's last hidden state ``hidden`` ``(B, T, D)`` (before the final norm).

        Depth k runs over the ``T - k`` positions whose token ``i + k`` exists, reading ``h^{k-1}``
        (``hidden`` for depth 1) there and the embedding of ``input_ids[:, i + k]``; its logits
        ``(B, T - k, vocab_size)`` at row i predict token ``i + k + 1``, through its final norm and
        the model's shared head. The depth's block reads its positional scheme (the model's, or its
        own: ``model.mtp.block.positional``) at the positions of its rows (``positions[:, :T - k]``),
        causally, each row in its document.
        """
        assert self.mtp is not None, "mtp_logits needs MTP depths"
        batch, length = input_ids.shape
        out = []
        for k in range(1, len(self.mtp) + 1):
            rows = length - k
            if rows <= 0:  # no token k ahead of any position: nothing to predict
                out.append(hidden.new_zeros((batch, 0, self.vocab_size)))
                continue
            hidden = self.mtp_depth(k, hidden[:, :rows], input_ids[:, k:], positions=positions[:, :rows],
                                    document_ids=document_ids[:, :rows] if document_ids is not None else None,
                                    plain_causal=plain_causal)  # (B, T - k, D): h^k
            out.append(self.output_logits(self.mtp[k - 1].final_norm(hidden)))
        return out

    def mtp_depth(self, k: int, hidden: Tensor, ahead_ids: Tensor, *, positions: Tensor,
                  document_ids: Tensor | None = None, plain_causal: bool = False) -> Tensor:
        """Depth ``k``'s hidden state ``h^k`` ``(B, R, D)`` (before its final norm) at ``R`` rows.

        ``hidden`` ``(B, R, D)``: ``h^{k-1}`` at those rows; ``ahead_ids`` ``(B, R)``: the token each
        row's depth reads (``k`` positions ahead of it); ``positions`` ``(B, R)``: the rows' own
        positions (negative: a padding row, never attended to). The block runs causally over the rows;
        :meth:`mtp_logits` runs every depth this way, and a caller may run one (a drafter does).
        """
        assert self.mtp is not None, "mtp_depth needs MTP depths"
        if not 1 <= k <= len(self.mtp):
            raise ValueError(f"MTP depth {k} does not exist; this model has depths 1 to {len(self.mtp)}")
        embedded = self.embedding(ahead_ids)  # (B, R, D): the shared embedding, scaled as the main model's
        if self.embedding_multiplier != 1.0:
            embedded = embedded * torch.tensor(self.embedding_multiplier, dtype=embedded.dtype)
        own = self.mtp[k - 1].positional
        if own is None:
            ctx = ForwardContext(positions=positions, positional=self.positional,
                                 positional_state=self.positional.prepare(positions), plain_causal=plain_causal)
        else:  # its own scheme, read as a layer's (ctx.positional_for) at the depth's layer index
            index = len(self.blocks) + k - 1
            ctx = ForwardContext(positions=positions, positional=self.positional, plain_causal=plain_causal,
                                 layer_schemes={index: own}, layer_states={index: own.prepare(positions)})
        ctx.document_ids = document_ids
        ctx.token_ids = ahead_ids  # the token each row's block input embeds
        return self.mtp[k - 1](hidden, embedded, ctx, residual=self.residual)

    def _check_first_cached(self) -> None:
        """A cache claims its columns for a forward at its lowest layer index, so the first layer that keeps
        something must run before any use of a shared block that keeps something (their slots come after the layers)."""
        keeps = [layer_state_slots(b) is not None or cache_slots_of(b.mixer) is not None for b in self.blocks]
        first_use = next(iter(self._use_slots), None)
        if first_use is None or not any(keeps):
            return
        shared = self.shared_blocks[self.shared_uses[first_use]]
        first_kept = keeps.index(True)
        if first_kept >= first_use and (layer_state_slots(shared) is not None or cache_slots_of(shared.mixer) is not None):
            raise ValueError(f"the shared block {self.shared_uses[first_use]!r} runs at layer {first_use}, before the first "
                             f"layer that keeps a cache (layer {first_kept}); a cache starts each forward at that layer, "
                             f"so run the shared block after it")

    def _shared_use(self, index: int, x: Tensor, ctx: ForwardContext, *,
                    embedded: Tensor) -> tuple[Tensor, Tensor | None]:
        """The shared block named for layer ``index``, run with the cache at that use's own slot and that use's
        adapters: ``(stream, None)`` for ``output: stream``; ``(x, addend)`` for ``output: mixer_input``, the
        block's output (times the use's projection) to add to layer ``index``'s mixer input. With input
        concat_embeddings the block reads ``input_norm(concat(x, embedded))``, 2 x d_model wide."""
        name = self.shared_uses[index]
        shared = self.shared_blocks[name]
        parts = self.shared_use_parts[str(index)] if str(index) in self.shared_use_parts else None
        hooks = self._adapter_hooks.get(name, ())
        for hook in hooks:
            hook.active = parts
        try:
            read = x if self._shared_input[name] == "stream" else shared.input_norm(torch.cat([x, embedded], dim=-1))
            out = shared(read, use_context(ctx, home=shared.mixer.layer_index, slot=self._use_slots[index]))
        finally:
            for hook in hooks:
                hook.active = None
        if self._shared_output[name] == "stream":
            return out, None
        return x, (parts.projection(out) if parts is not None and parts.projection is not None else out)

    def _context(self, positions: Tensor, *, cache: KVCache | None, plain_causal: bool) -> ForwardContext:
        """The per-forward context: each distinct positional scheme prepared once, whatever the number of layers."""
        if self.layer_scheme is None:
            return ForwardContext(positions=positions, positional=self.positional,
                                  positional_state=self.positional.prepare(positions), cache=cache,
                                  plain_causal=plain_causal)
        schemes = [self.positional, *self.layer_positionals]
        used = set(self.layer_scheme) | ({0} if len(self.shared_blocks) else set())  # shared blocks: model-level
        states = [s.prepare(positions) if i in used else None for i, s in enumerate(schemes)]
        return ForwardContext(
            positions=positions,
            positional=self.positional,
            positional_state=states[0],
            cache=cache,
            plain_causal=plain_causal,
            layer_schemes=[schemes[i] for i in self.layer_scheme],
            layer_states=[states[i] for i in self.layer_scheme],
        )

    def positional_of_layer(self, layer_index: int) -> PositionalScheme:
        """The positional scheme inside the attention of layer ``layer_index``."""
        if self.layer_scheme is None:
            return self.positional
        return [self.positional, *self.layer_positionals][self.layer_scheme[layer_index]]

    def positional_schemes(self) -> list[PositionalScheme]:
        """Every distinct positional scheme of the model: the model-level one, the per-layer ones, the MTP depths' own."""
        return [self.positional, *self.layer_positionals,
                *(d.positional for d in (self.mtp or ()) if d.positional is not None)]

    def past_context(self) -> tuple[str, PositionalScheme]:
        """Whether positions allow going past ``context_length``: "no" over "warn" over "yes", and the scheme that says so."""
        rank = {"yes": 0, "warn": 1, "no": 2}
        return max(((s.extrapolates, s) for s in self.positional_schemes()), key=lambda pair: rank[pair[0]])

    def check_past_context(self, length: int) -> None:
        """Allow a forward of ``length`` tokens past ``context_length`` as :meth:`past_context` says: "yes"
        silently, "warn" with one warning per model (the positions were never trained there), "no" a ValueError."""
        verdict, scheme = self.past_context()
        name = type(scheme).__name__
        if verdict == "no":
            raise ValueError(f"sequence of {length} tokens is longer than the context length {self.context_length} "
                             f"(its {name} has no position past it); give at most {self.context_length} tokens")
        if verdict == "warn" and not getattr(self, "_warned_past_context", False):
            warnings.warn(f"a sequence of {length} tokens, past the model's context length of {self.context_length}: "
                          f"its positions ({name}) were never trained there, so quality may drop",
                          stacklevel=_caller_stacklevel())
            self._warned_past_context = True  # once per model, shared with generation's warning

    def cache_restarts(self) -> set[int]:
        """Lengths at which keys cached before become stale (a scheme's ``restart_cache_at``, e.g. LongRoPE's switch)."""
        return {s.restart_cache_at for s in self.positional_schemes() if s.restart_cache_at is not None}

    def head_logits(self, x: Tensor) -> Tensor:
        """Logits ``(B, T, vocab_size)`` of a residual stream as the blocks pass it: collapsed to ``(B, T, d_model)``
        (:meth:`ResidualStream.collapse`, a no-op for one stream), final norm, LM head, scale, soft-cap.

        The forward ends with this; the logit lens applies it to the stream after every layer.
        """
        return self.output_logits(self.final_norm(self.residual.collapse(x)))

    def output_logits(self, x: Tensor) -> Tensor:
        """Logits ``(B, T, vocab_size)`` of normed hidden states ``(B, T, D)``: the LM head (shared by the MTP
        depths), its bias, scale and soft-cap, the padded vocabulary cut off."""
        logits = F.linear(x, self.embedding.weight) if self.lm_head is None else self.lm_head(x)
        if self.head_bias is not None:
            logits = self.head_bias(logits)
        if self.logit_scale != 1.0:
            logits = logits * self.logit_scale
        if self.logit_softcap is not None:
            logits = torch.tanh(logits / self.logit_softcap) * self.logit_softcap
        if logits.shape[-1] != self.vocab_size:
            logits = logits[..., : self.vocab_size]
        return logits

    # -- facts other plugins need -------------------------------------------------------

    def attention_modules(self) -> list[AttentionLayer]:
        """Each block's attention, in layer order, with its public facts (:class:`~specformer.model.attention.AttentionLayer`)."""
        return [block.mixer for block in self.blocks] + self.shared_use_facts()

    def shared_use_facts(self) -> list[SharedUse]:
        """One :class:`~specformer.model.shared.SharedUse` per use of a shared block, in layer order: the shared
        mixer's facts at the use's own cache slot (``attention_modules()`` lists them after the layers' mixers)."""
        return [SharedUse(self.shared_blocks[self.shared_uses[i]].mixer, block=self.shared_blocks[self.shared_uses[i]],
                          slot=slot, layer=i) for i, slot in self._use_slots.items()]

    def layer_blocks(self) -> list[nn.Module]:
        """The block behind each entry of ``attention_modules()``: every layer's, then the shared block of each use."""
        return [*self.blocks, *(use.block for use in self.shared_use_facts())]

    def auxiliary_loss(self) -> Tensor | None:
        """The sum of auxiliary losses (e.g. MoE load balancing) set by the last forward, if any."""
        losses = [m.aux_loss for m in self.modules() if isinstance(getattr(m, "aux_loss", None), Tensor)]
        return torch.stack(losses).sum() if losses else None

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= self.embedding.weight.numel()
            total -= sum(p.numel() for p in self.positional.parameters())
        return total

    # -- initialisation -------------------------------------------------------------------

    def init_weights(self, *, std: float = 0.02) -> None:
        """GPT-2 style init: normal(std) everywhere, output projections scaled by 1/sqrt(2 * n_layers).

        Each component knows which of its weights feed the residual stream and implements
        ``init_weights(std=..., residual_std=...)``; the Decoder only handles its own tensors.
        """
        residual_std = std / math.sqrt(2 * len(self.blocks))
        nn.init.normal_(self.embedding.weight, mean=0.0, std=std)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=std)
            if self.lm_head.bias is not None:
                nn.init.zeros_(self.lm_head.bias)
        for module in self._components():
            module.init_weights(std=std, residual_std=residual_std)

    def _components(self) -> Iterator[nn.Module]:
        for module in self.modules():
            if module is not self and callable(getattr(module, "init_weights", None)):
                yield module


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the code that called the model: the first frame
    outside specformer's core and torch.nn (``model(ids)`` reaches ``forward`` through ``Module.__call__``)."""
    ours = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(nn.__file__)))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(ours):
        frame, level = frame.f_back, level + 1
    return level
