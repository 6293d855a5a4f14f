"""StableLM (``model_type: stablelm``, StableLM 2): LayerNorm, partial rotary, optional q/k/v biases and parallel blocks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor

from specformer_hf.config import ConfigReader
from specformer_hf.specview import NotExpressible
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, FamilyView, Fixed, Part, Switch
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Rule, Site

#: transformers' StableLmConfig defaults.
DEFAULTS = {
    "vocab_size": 50304, "intermediate_size": 6912, "hidden_size": 2560, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 4096,
    "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "use_qkv_bias": False, "qk_layernorm": False,
    "use_parallel_residual": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
}


class PerHead(Rule):
    """One checkpoint tensor per head (``...norms.{h}.weight``) <-> one parameter per head (``q_norm.{h}.weight``)."""

    def __init__(self, hf: str, ours: str, *, heads: Callable[[Site], int]) -> None:
        self.templates, self.heads = (hf, ours), heads
        self.hf, self.ours = (hf,), (ours,)  # templates; expand_at gives every head's names

    @property
    def per_layer(self) -> bool:
        return True

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        hf, ours = self.templates
        heads = range(self.heads(site))
        return (tuple(hf.format(i=site.layer, h=h) for h in heads), tuple(ours.format(i=site.layer, h=h) for h in heads))

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors)

    def describe(self) -> str:
        return f"{self.templates[0]} -> {self.templates[1]} (every head h)"


@dataclass(frozen=True)
class QKLayerNorm(Part):
    """qk_layernorm <-> qk_norm bias-free LayerNorm (eps layer_norm_eps) with ``qk_norm_scope: per_head_weights``.

    transformers' StableLmLayerNormPerHead keeps one LayerNorm (no bias) per query and per key head.
    ``switch``: the config field that turns them on (Cohere's use_qk_norm, whose weights differ in layout only).
    """

    switch: str = "qk_layernorm"

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.require(self.switch, (False, True), why="it switches per-head q/k LayerNorms on or off"):
            model.setdefault("block", {}).setdefault("mixer", {}).update(
                qk_norm={"kind": "layernorm", "eps": cfg.get_float("layer_norm_eps"), "bias": False},
                qk_norm_scope="per_head_weights")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        norm = view.uniform("mixer", "qk_norm")
        if norm is not None and view.uniform("mixer", "qk_norm_scope") != "per_head_weights":
            raise NotExpressible("model.block.mixer.qk_norm_scope",
                                 f"Hugging Face {view.name}'s {self.switch} keeps separate weights for every head "
                                 "(qk_norm_scope: per_head_weights)")
        config[self.switch] = norm is not None  # the read-back comparison checks its kind, bias and eps

    def rules(self) -> list[Rule]:
        return [PerHead(f"{ATTN}.q_layernorm.norms.{{h}}.weight", f"{BLOCK_MIXER}.q_norm.{{h}}.weight",
                        heads=lambda site: site.mixer.n_heads),
                PerHead(f"{ATTN}.k_layernorm.norms.{{h}}.weight", f"{BLOCK_MIXER}.k_norm.{{h}}.weight",
                        heads=lambda site: site.mixer.n_kv_heads)]


FAMILY = decoder_family(
    name="StableLM",
    model_type="stablelm",
    architecture="StableLmForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Rope(partial=True, write_fraction=True),
        Layout("prenorm", norm_bias=True, parallel_key="use_parallel_residual"),
        LayerNorm(),
        Attention(head_dim=False),
        GatedFFN(),
        Switch("use_qkv_bias", ("mixer.qkv_bias",)),
        Fixed("mixer.out_bias", False, why="has no o_proj bias"),
        QKLayerNorm(),
    ],
    maps="LayerNorm with biases, rope with partial_rotary_factor (default 0.25), GQA, use_qkv_bias, SwiGLU, "
         "use_parallel_residual -> layout parallel with one shared norm, qk_layernorm -> qk_norm bias-free LayerNorm "
         "with qk_norm_scope per_head_weights (a separate norm for every head, StableLM 2 12B)",
    caveats="head_dim is always hidden / heads",
)
