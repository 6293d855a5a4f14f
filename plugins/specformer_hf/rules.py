"""Weight rules: how Hugging Face tensors become Decoder parameters and back.

A family lists its rules once; each rule names Hugging Face tensors and specformer
parameters (``{i}`` stands for the layer index) and knows the transform between them
in both directions, so import and export cannot drift apart. A rule whose
specformer parameters the model does not have (a bias the spec leaves out) is
skipped; any Hugging Face tensor that no rule consumed is then reported, so a
checkpoint carrying weights the spec ignores is refused rather than half-loaded.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor


#: Where a checkpoint keeps decoder layer ``i``: the prefix of every per-layer rule's names.
LAYERS = "model.layers.{i}"


@dataclass(frozen=True)
class Site:
    """Where a rule is applied: the model being filled or read, and the layer (None outside blocks).

    ``depth`` (a multi-token prediction depth, ``model.mtp[depth]``): the checkpoint keeps that
    depth as layer ``layer`` (DeepSeek-V3's ``model.layers.{N + depth}``); our names of a block's
    parameters, ``blocks.{i}.*``, become the depth's block's, ``mtp.{depth}.block.*``, and ``{d}``
    in a name is the depth. ``layer_at``: where the checkpoint keeps this site's decoder layer, a
    family that keeps its depths' layers elsewhere than after the last (Qwen3-Next: ``mtp.layers.{d}``)
    names it, and the per-layer rules' names (under :data:`LAYERS`) move there.
    """

    model: Any
    layer: int | None
    depth: int | None = None
    layer_at: str = LAYERS

    @property
    def block(self) -> Any:
        return self.model.mtp[self.depth].block if self.depth is not None else self.model.blocks[self.layer]

    @property
    def mixer(self) -> Any:
        return self.block.mixer

    @property
    def ffn(self) -> Any:
        return self.block.ffn

    def hf_name(self, template: str, **more: Any) -> str:
        """A checkpoint name template filled in at this site."""
        if self.layer is None:
            return template
        if self.layer_at != LAYERS and template.startswith(LAYERS + "."):
            template = self.layer_at + template[len(LAYERS):]
        return template.format(i=self.layer, d=self.depth, **more)

    def our_name(self, template: str) -> str:
        """One of our name templates filled in at this site (a block's parameter moved into an MTP depth's block)."""
        if self.layer is None:
            return template
        if self.depth is not None and template.startswith("blocks.{i}."):
            template = f"mtp.{self.depth}.block." + template[len("blocks.{i}."):]
        return template.format(i=self.layer, d=self.depth)


def sites_of(rule: "Rule", model: Any, *, depth_layer: str = LAYERS) -> list[Site]:
    """Where ``rule`` applies in ``model``: once; every layer; or every MTP depth (a rule naming ``{d}``), where the
    per-layer rules apply too, the depth's block kept as checkpoint layer ``n_layers + depth``, at ``depth_layer``
    (the family's :attr:`~specformer_hf.family.Family.mtp_layer`)."""
    n_layers = len(model.blocks)
    depths = [Site(model, n_layers + d, d, depth_layer) for d in range(len(model.mtp or ()))]
    if rule.per_depth:
        return depths
    if rule.per_layer:
        return [Site(model, i) for i in range(n_layers)] + depths
    return [Site(model, None)]


class Rule(ABC):
    """Base class: ``hf`` and ``ours`` are name templates; subclasses define the two transforms."""

    hf: tuple[str, ...]
    ours: tuple[str, ...]

    @abstractmethod
    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        """The Hugging Face tensors at ``site`` as ours."""

    @abstractmethod
    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        """Our tensors at ``site`` as Hugging Face's."""

    @property
    def per_layer(self) -> bool:
        return any("{i}" in name for name in (*self.hf, *self.ours))

    @property
    def per_depth(self) -> bool:
        """A rule for each multi-token prediction depth only (its names hold ``{d}``)."""
        return any("{d}" in name for name in (*self.hf, *self.ours))

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The concrete (hf names, our names) at ``site``."""
        return tuple(site.hf_name(n) for n in self.hf), tuple(site.our_name(n) for n in self.ours)

    def describe(self) -> str:
        return f"{', '.join(self.hf)} -> {', '.join(self.ours)}"

    def for_import(self, site: Site, present: Callable[[str], bool]) -> tuple["Rule", tuple[str, ...], tuple[str, ...]]:
        """The rule that reads ``site`` from a checkpoint whose tensors ``present`` tells, with its names."""
        return (self, *self.expand_at(site))


class Copy(Rule):
    """The same tensor under another name."""

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors)


class Transposed(Rule):
    """A 2-d weight stored (in, out), as GPT-2's ``Conv1D`` does, where ``nn.Linear`` stores (out, in)."""

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].t().contiguous()]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].t().contiguous()]


class Unsqueezed(Rule):
    """A tensor the checkpoint stores with a leading axis of one (ERNIE 4.5 MoE's ``(1, E)`` expert bias) as ours ``(E,)``."""

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].reshape(tensors[0].shape[1:])]  # (1, *S) -> S

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].unsqueeze(0)]  # S -> (1, *S)


class DepthwiseConv(Rule):
    """Depthwise ``nn.Conv1d`` weights ``(C_i, 1, K)`` as a recurrent mixer's ``conv_weight`` ``(C, K)``.

    Several checkpoint tensors (q, k and v convolved apart, as OLMo Hybrid and Kimi Linear save
    them) are concatenated over channels; export splits at ``sizes(site)``.
    """

    def __init__(self, hf: str | Sequence[str], ours: str, *, sizes: Callable[[Site], Sequence[int]] | None = None) -> None:
        self.hf, self.ours = ((hf,) if isinstance(hf, str) else tuple(hf)), (ours,)
        if len(self.hf) > 1 and sizes is None:
            raise ValueError("a convolution saved in several tensors needs the sizes to split it at")
        self.sizes = sizes

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [torch.cat(tensors, dim=0).squeeze(1).contiguous()]  # (C, K)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        weight = tensors[0].unsqueeze(1)  # (C, 1, K)
        if len(self.hf) == 1:
            return [weight.contiguous()]
        return [part.contiguous() for part in weight.split(list(self.sizes(site)), dim=0)]


class Fused(Rule):
    """Several Hugging Face tensors concatenated along ``dim`` into one of ours (q, k, v -> qkv).

    ``sizes(site)`` gives the length of each part along ``dim`` for export; on import the
    parts' own shapes decide.
    """

    def __init__(self, hf: Sequence[str], ours: str, *, sizes: Callable[[Site], Sequence[int]], dim: int = 0) -> None:
        self.hf, self.ours = tuple(hf), (ours,)
        self.sizes = sizes
        self.dim = dim

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [torch.cat(tensors, dim=self.dim)]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [part.contiguous() for part in tensors[0].split(list(self.sizes(site)), dim=self.dim)]


class ReversedRopeQK(Fused):
    """q, k, v fused into our ``qkv`` with the second half of every query and key head negated (and back on export).

    A family whose ``rotate_half`` is ``cat(x2, -x1)`` (nanochat) turns its rope the other way:
    ``R(-t) q = N R(t) N q`` with ``N`` negating each head's second half, and ``N`` leaves q . k
    unchanged, so negating those rows of the projections makes the usual rope give the same scores.
    (A norm over each head, which sign flips and rotations leave alone, commutes with all of it.)
    """

    def __init__(self, hf: Sequence[str], ours: str) -> None:
        super().__init__(hf, ours, sizes=qkv_sizes)

    @staticmethod
    def _negate_second_halves(t: Tensor, site: Site) -> Tensor:
        a = site.mixer
        q_rows, k_rows = a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim
        out = t.clone()
        for start, heads in ((0, a.n_heads), (q_rows, a.n_kv_heads)):
            rows = out[start:start + heads * a.head_dim]
            halves = rows.view(heads, 2, a.head_dim // 2, *t.shape[1:])  # (H, first/second half, hd/2, ...)
            halves[:, 1].neg_()
        return out

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [self._negate_second_halves(super().to_ours(tensors, site)[0], site)]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return super().to_hf([self._negate_second_halves(tensors[0], site)], site)


class HeadInterleavedQKV(Rule):
    """GPT-NeoX's fused projection, grouped by head ``[q_h; k_h; v_h]`` for each head h.

    Ours groups by role ``[q (all heads); k; v]``; both hold ``3 * n_heads * head_dim``
    rows (weight) or entries (bias).
    """

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0]
        heads, head_dim = site.mixer.n_heads, site.mixer.head_dim
        grouped = t.reshape(heads, 3, head_dim, *t.shape[1:])  # (H, 3, hd, ...)
        return [grouped.transpose(0, 1).reshape(t.shape).contiguous()]  # (3, H, hd, ...) flattened

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0]
        heads, head_dim = site.mixer.n_heads, site.mixer.head_dim
        grouped = t.reshape(3, heads, head_dim, *t.shape[1:])  # (3, H, hd, ...)
        return [grouped.transpose(0, 1).reshape(t.shape).contiguous()]  # (H, 3, hd, ...) flattened


class PerExpert(Rule):
    """One tensor per expert in the checkpoint (``...experts.{j}.w1.weight``), stacked along a new dim 0 in ours.

    ``parts`` lists the per-expert tensor templates that are concatenated (along
    ``dim`` of each expert's slice) into one stacked tensor: Mixtral's w1 (gate) and
    w3 (up) become one ``(n_experts, 2 * hidden, d_model)`` gate_up tensor.
    """

    def __init__(self, parts: Sequence[str], ours: str, *, n_experts: Callable[[Site], int], dim: int = 0) -> None:
        self.parts = tuple(parts)
        self.ours = (ours,)
        self.n_experts = n_experts
        self.dim = dim
        self.hf = ()  # depends on the number of experts: see expand

    @property
    def per_layer(self) -> bool:
        return True

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        count = self.n_experts(site)
        hf = tuple(site.hf_name(part, j=j) for j in range(count) for part in self.parts)
        return hf, tuple(site.our_name(name) for name in self.ours)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        n = len(self.parts)
        experts = [torch.cat(tensors[j * n : (j + 1) * n], dim=self.dim) for j in range(len(tensors) // n)]
        return [torch.stack(experts)]  # (n_experts, ...)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        out = []
        for expert in tensors[0].unbind(0):
            out += [p.contiguous() for p in expert.chunk(len(self.parts), dim=self.dim)]
        return out

    def describe(self) -> str:
        return f"{', '.join(self.parts)} (every expert j) -> {', '.join(self.ours)}"


class InterleavedGateUp(Rule):
    """gpt-oss's fused experts: ``gate_up_proj`` (n_experts, d_model, 2 * hidden) with gate and up in alternate
    columns (gate = 0::2, up = 1::2), its bias (n_experts, 2 * hidden) alike; ours is (n_experts, 2 * hidden,
    d_model) with rows [gate; up], the bias [gate; up]. ``bias``: the rule moves the bias."""

    def __init__(self, hf: str, ours: str, *, bias: bool = False) -> None:
        self.hf, self.ours = (hf,), (ours,)
        self.bias = bias

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0] if self.bias else tensors[0].transpose(1, 2)  # (E, 2H[, D]) interleaved
        return [torch.cat([t[:, 0::2], t[:, 1::2]], dim=1).contiguous()]  # (E, 2H[, D]): [gate; up]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0]
        gate, up = t.chunk(2, dim=1)  # (E, H[, D]) each
        interleaved = torch.stack([gate, up], dim=2).flatten(1, 2)  # (E, 2H[, D]): gate_0, up_0, gate_1, ...
        return [interleaved.contiguous() if self.bias else interleaved.transpose(1, 2).contiguous()]


class TransposedExperts(Rule):
    """A stack of expert matrices stored (n_experts, in, out) where ours are (n_experts, out, in) (gpt-oss's down_proj)."""

    def __init__(self, hf: str, ours: str) -> None:
        self.hf, self.ours = (hf,), (ours,)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].transpose(1, 2).contiguous()]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].transpose(1, 2).contiguous()]


class FlatExperts(Rule):
    """Experts stored as 2-D matrices ``(n_experts * hidden, d_model)`` (DBRX's ``w1``, ``v1``, ``w2``), ours stacked.

    Without ``transposed``, the tensors (gate, then up) become ``experts_in`` ``(n_experts,
    parts * hidden, d_model)``, each expert's slices concatenated; with it, the one tensor holds
    each expert's down projection transposed (``(hidden, d_model)`` per expert, applied as
    ``h @ w2``) and becomes ``experts_out`` ``(n_experts, d_model, hidden)``.
    """

    def __init__(self, hf: Sequence[str], ours: str, *, transposed: bool = False) -> None:
        self.hf, self.ours = tuple(hf), (ours,)
        if transposed and len(self.hf) != 1:
            raise ValueError("a transposed expert stack is one tensor")
        self.transposed = transposed

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        n = site.ffn.n_experts
        stacks = [t.reshape(n, t.shape[0] // n, t.shape[1]) for t in tensors]  # (E, F, D) each
        if self.transposed:
            return [stacks[0].transpose(1, 2).contiguous()]  # (E, D, F)
        return [torch.cat(stacks, dim=1).contiguous()]  # (E, parts * F, D)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        t = tensors[0]
        if self.transposed:
            return [t.transpose(1, 2).reshape(-1, t.shape[1]).contiguous()]  # (E, F, D) -> (E * F, D)
        return [part.reshape(-1, t.shape[2]).contiguous() for part in t.chunk(len(self.hf), dim=1)]  # (E * F, D) each


class OneOf(Rule):
    """Checkpoints name the same parameters in several ways: import reads whichever the file has, export the first.

    transformers 5 keeps a mixture's experts as fused 3-D tensors in memory
    (``mlp.experts.gate_up_proj``) and saves most families per expert; files written either
    way are read (Mixtral, Qwen-MoE).
    """

    def __init__(self, *options: Rule) -> None:
        if len({o.ours for o in options}) != 1:
            raise ValueError("OneOf options must fill the same parameters")
        self.options = options
        self.hf, self.ours = options[0].hf, options[0].ours

    @property
    def per_layer(self) -> bool:
        return self.options[0].per_layer

    @property
    def per_depth(self) -> bool:
        return self.options[0].per_depth

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return self.options[0].expand_at(site)

    def for_import(self, site: Site, present: Callable[[str], bool]) -> tuple[Rule, tuple[str, ...], tuple[str, ...]]:
        for option in self.options:
            hf, ours = option.expand_at(site)
            if all(present(name) for name in hf):
                return option, hf, ours
        return (self.options[0], *self.options[0].expand_at(site))  # report the names export writes as missing

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return self.options[0].to_ours(tensors, site)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return self.options[0].to_hf(tensors, site)

    def describe(self) -> str:
        return " or ".join(o.describe() for o in self.options)


class AtLayers(Rule):
    """``rule`` only at the layers where ``where(site)`` holds; at the others it names no tensors and moves none.

    In a hybrid, attention and recurrent layers can both have a parameter of the same name
    (``mixer.out``) filled from different checkpoint tensors (``self_attn.o_proj``,
    ``mamba.out_proj``): each rule claims only the layers of its own mixer.
    """

    def __init__(self, rule: Rule, *, where: Callable[[Site], bool], layers: str = "some") -> None:
        self.rule, self.where, self.layers = rule, where, layers
        self.hf, self.ours = rule.hf, rule.ours

    @property
    def per_layer(self) -> bool:
        return True

    @property
    def per_depth(self) -> bool:
        return self.rule.per_depth

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return self.rule.expand_at(site) if self.where(site) else ((), ())

    def for_import(self, site: Site, present: Callable[[str], bool]) -> tuple["Rule", tuple[str, ...], tuple[str, ...]]:
        return self.rule.for_import(site, present) if self.where(site) else (self, (), ())

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return self.rule.to_ours(tensors, site) if tensors else []

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return self.rule.to_hf(tensors, site) if tensors else []

    def describe(self) -> str:
        return f"{self.rule.describe()} ({self.layers} layers)"


def renamed(rule: Rule, rename: Callable[[str], str]) -> Rule:
    """``rule`` reading and writing its Hugging Face tensors under ``rename(name)``, with the same transforms.

    For a checkpoint saved under other names than the family whose rules it reuses (transformers
    renames them on load and back on save: Sarvam-30B's ``attention.dense`` is GLM-4.5's ``self_attn.o_proj``).
    """
    new = copy.copy(rule)
    if isinstance(rule, OneOf):
        new.options = tuple(renamed(option, rename) for option in rule.options)
    elif isinstance(rule, AtLayers):
        new.rule = renamed(rule.rule, rename)
    elif isinstance(rule, PerExpert):
        new.parts = tuple(rename(name) for name in rule.parts)
    new.hf = tuple(rename(name) for name in rule.hf)
    return new


# -- split sizes ------------------------------------------------------------------------


def qkv_sizes(site: Site) -> tuple[int, int, int]:
    """Rows of q, k and v in our fused ``qkv``: ``n_heads * hd``, ``n_kv * hd``, ``n_kv * v_head_dim`` (the values'
    own width where the attention has one, else ``hd``)."""
    a = site.mixer
    return a.n_heads * a.head_dim, a.n_kv_heads * a.head_dim, a.n_kv_heads * getattr(a, "v_head_dim", a.head_dim)


def halves(site: Site) -> tuple[int, int]:
    """Gate and up rows of our fused ``gate_up``: equal halves."""
    hidden = site.ffn.hidden
    return hidden, hidden


__all__ = ["AtLayers", "Copy", "DepthwiseConv", "FlatExperts", "Fused", "HeadInterleavedQKV", "InterleavedGateUp", "OneOf", "PerExpert",
           "ReversedRopeQK",
           "TransposedExperts", "Rule", "Site", "Transposed", "Unsqueezed", "halves", "qkv_sizes", "renamed"]
