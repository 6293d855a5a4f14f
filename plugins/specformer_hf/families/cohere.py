"""Cohere (``model_type: cohere``, Command R, Command R+): parallel blocks under one bias-free LayerNorm, an interleaved
rope on every layer, scaled logits, and optional per-head q/k LayerNorms (Command R+)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from specformer_hf.families.stablelm import QKLayerNorm
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, Switch, Value
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Rule, Site

#: transformers' CohereConfig defaults (Command R's sizes, c4ai-command-r-v01).
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "logit_scale": 0.0625,
    "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": None, "hidden_act": "silu",
    "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False,
    "use_qk_norm": False, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
}


class StackedHeads(Rule):
    """One ``(heads, head_dim)`` checkpoint tensor <-> one parameter per head (``q_norm.{h}.weight``)."""

    def __init__(self, hf: str, ours: str, *, heads: Callable[[Site], int]) -> None:
        self.hf, self.ours, self.heads = (hf,), (ours,), heads  # ours is a template over h too: see expand_at

    @property
    def per_layer(self) -> bool:
        return True

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return ((self.hf[0].format(i=site.layer),),
                tuple(self.ours[0].format(i=site.layer, h=h) for h in range(self.heads(site))))

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [row.clone() for row in tensors[0].unbind(0)]  # (heads, head_dim) -> heads x (head_dim,)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [torch.stack(tensors, dim=0)]  # heads x (head_dim,) -> (heads, head_dim)

    def describe(self) -> str:
        return f"{self.hf[0]} -> {self.ours[0]} (row h of the tensor for head h)"


@dataclass(frozen=True)
class StackedQKLayerNorm(QKLayerNorm):
    """use_qk_norm <-> StableLM's per-head q/k LayerNorms; Cohere stores each as one (heads, head_dim) weight."""

    switch: str = "use_qk_norm"

    def rules(self) -> list[Rule]:
        return [StackedHeads(f"{ATTN}.q_norm.weight", f"{BLOCK_MIXER}.q_norm.{{h}}.weight",
                             heads=lambda site: site.mixer.n_heads),
                StackedHeads(f"{ATTN}.k_norm.weight", f"{BLOCK_MIXER}.k_norm.{{h}}.weight",
                             heads=lambda site: site.mixer.n_kv_heads)]


FAMILY = decoder_family(
    name="Cohere",
    model_type="cohere",
    architecture="CohereForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Rope(interleaved=True),
        Layout("parallel"),
        LayerNorm(bias=False),
        Attention(head_dim=False),
        GatedFFN(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Value("logit_scale", "logit_scale"),
        StackedQKLayerNorm(),
    ],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="layout parallel with one shared bias-free LayerNorm, rope interleaved (adjacent pairs) on every layer, "
         "logit_scale, GQA, attention_bias, SwiGLU; use_qk_norm -> qk_norm bias-free LayerNorm with qk_norm_scope "
         "per_head_weights (q_norm.weight and k_norm.weight hold one row per head)",
    caveats="head_dim is always hidden / heads; the q/k norms share layer_norm_eps with the block norms",
)
