"""Flint (``model_type: flint``, RecursiveSI/flint): Qwen3-MoE's attention (an RMSNorm per query and key head) with
learned per-head sinks, sliding-window layers with rope beside global layers without positions, and sigmoid-routed
experts plus one ungated shared expert after dense first layers.

The router scores every expert by the sigmoid of its logit, keeps the ``num_experts_per_tok``
best plain scores (no selection bias: our ``sigmoid_topk`` with ``selection_bias: false``) and
renormalises them with ``norm_topk_prob``; the shared expert (a SwiGLU of
``shared_expert_intermediate_size``) is added as it is, with no gate. ``mlp_only_layers`` and
``decoder_sparse_step`` make layers dense (a SwiGLU of ``intermediate_size``). Checkpoints
name the sinks ``self_attn.softmax_offset`` (transformers renames them ``sinks`` on load and
back on save); both are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families.gpt_oss import Sinks
from specformer_hf.parts.attention import Attention, QKNorm
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, Part, Switch
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import MixtureOfExperts
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.windows import SlidingRopeGlobalNope
from specformer_hf.rules import Copy, OneOf, Rule

#: transformers' FlintConfig defaults (its docstring names RecursiveSI/flint; Qwen2MoeConfig's for the rest).
DEFAULTS = {
    "vocab_size": 150144, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 49,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "sliding_window": 513, "decoder_sparse_step": 1, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 1024, "num_experts_per_tok": 6, "num_experts": 256, "norm_topk_prob": True,
    "router_aux_loss_coef": 0.0005, "mlp_only_layers": None, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


def default_layer_types(n_layers: int) -> list[str]:
    """FlintConfig without layer_types: the first two, every fourth from layer 1 and the last layer are global."""
    return ["full_attention" if i < 2 or i % 4 == 1 or i == n_layers - 1 else "sliding_attention"
            for i in range(n_layers)]


@dataclass(frozen=True)
class PostInitDefaults(Part):
    """What FlintConfig's __post_init__ puts in place of a null layer_types and mlp_only_layers (save_pretrained writes
    the filled values; a hand-written config.json may leave them null)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get("layer_types", None) is None:
            cfg.data["layer_types"] = default_layer_types(cfg.get_layers("num_hidden_layers"))
        if cfg.get("mlp_only_layers", None) is None:
            cfg.data["mlp_only_layers"] = [0, 1]


@dataclass(frozen=True)
class FlintSinks(Sinks):
    """gpt-oss's learned sinks, saved as ``softmax_offset``."""

    def rules(self) -> list[Rule]:
        sinks = f"{BLOCK_MIXER}.sinks"
        return [OneOf(Copy(f"{ATTN}.softmax_offset", sinks), Copy(f"{ATTN}.sinks", sinks))]


FAMILY = decoder_family(
    name="Flint",
    model_type="flint",
    architecture="FlintForCausalLM",
    defaults=DEFAULTS,
    parts=[
        PostInitDefaults(),
        Sizes(),
        SlidingRopeGlobalNope(),  # layer_types, always there after PostInitDefaults, decide
        Layout("prenorm"),
        RMSNorm(),
        Attention(),
        MixtureOfExperts(hidden="moe_intermediate_size", normalize="norm_topk_prob", shared=True, shared_gate=False,
                         dense=True, sigmoid=True),
        QKNorm("head"),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        FlintSinks(),
    ],
    maps="as Qwen3-MoE's attention (prenorm RMSNorm, GQA with head_dim, qk_norm RMSNorm per head, attention_bias) with "
         "learned sinks (self_attn.softmax_offset or sinks); layer_types + sliding_window -> per-layer windows, the rope "
         "on the sliding layers and positional none on the global ones; ffn moe: num_experts, num_experts_per_tok, "
         "moe_intermediate_size, router sigmoid_topk with selection_bias false (norm_topk_prob), one ungated shared "
         "expert of shared_expert_intermediate_size (shared_gate false); mlp_only_layers / decoder_sparse_step -> "
         "dense layers (intermediate_size)",
    caveats="one sliding_window for every sliding layer, and at least one sliding layer to export; reads per-expert "
            "and fused 3-D expert tensors, writes per-expert",
)
