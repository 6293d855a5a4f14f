"""AFMoE (``model_type: afmoe``, Arcee's Trinity models): sandwich-normed blocks whose attention normalises each query
and key head and gates its output channel by channel, sliding-window layers with rope beside global layers without
positions, and sigmoid-routed experts plus ungated shared experts after dense first layers.

The router is DeepSeek-V3's without groups: sigmoid scores, the ``num_experts_per_tok`` best of
the scores plus ``expert_bias`` (our ``selection_bias``) chosen, always renormalised and
multiplied by ``route_scale``; ``num_shared_experts`` shared experts are one SwiGLU
``num_shared_experts * moe_intermediate_size`` wide, added without a gate. The first
``num_dense_layers`` layers are a SwiGLU of ``intermediate_size``. ``mup_enabled`` multiplies
the token embeddings by ``sqrt(hidden_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import Attention, QKNorm
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, MLP, FamilyView, Part, Refuse
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN, GroupedExperts, expert_rules, shared_halves
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.windows import SlidingRopeGlobalNope
from specformer_hf.rules import Copy, Fused, Rule
from specformer_hf.specview import NotExpressible

#: transformers' AfmoeConfig defaults.
DEFAULTS = {
    "vocab_size": 200192, "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 1408,
    "num_hidden_layers": 32, "num_dense_layers": 1, "num_attention_heads": 16, "num_key_value_heads": None,
    "head_dim": 128, "hidden_act": "silu", "max_position_embeddings": 16384, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False, "num_experts": 64, "num_experts_per_tok": 6, "num_shared_experts": 2,
    "route_scale": 1.0, "global_attn_every_n_layers": 4, "sliding_window": 1024, "layer_types": None,
    "mup_enabled": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

#: AfmoeConfig's names for DeepSeek-V3's expert fields: (its name, the experts part's name).
EXPERT_NAMES = (("num_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts"),
                ("route_scale", "routed_scaling_factor"), ("num_dense_layers", "first_k_dense_replace"))
#: What DeepSeek-V3's router has that AFMoE's fixes: renormalised top-k weights, no groups.
FIXED = {"norm_topk_prob": True, "n_group": 1, "topk_group": 1}
#: The sandwich's norms under AFMoE's names.
NORMS = (("attention_norm", "input_layernorm"), ("attention_post_norm", "post_attention_layernorm"),
         ("ffn_norm", "pre_mlp_layernorm"), ("ffn_post_norm", "post_mlp_layernorm"))


@dataclass(frozen=True)
class DefaultLayerTypes(Part):
    """AfmoeConfig without layer_types: every global_attn_every_n_layers-th layer global, the others sliding."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        every = cfg.get_size("global_attn_every_n_layers")
        if cfg.get("layer_types", None) is None:
            cfg.data["layer_types"] = ["sliding_attention" if (i + 1) % every else "full_attention"
                                       for i in range(cfg.get_layers("num_hidden_layers"))]


@dataclass(frozen=True)
class MupEmbedding(Part):
    """mup_enabled <-> token embeddings multiplied by sqrt(hidden_size) (``embedding_multiplier: sqrt_d_model``)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get("mup_enabled"):
            model["embedding_multiplier"] = "sqrt_d_model"

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m = view.model
        scaled = m.embedding_multiplier == "sqrt_d_model" or float(m.embedding_multiplier) == m.d_model ** 0.5
        if not scaled and float(m.embedding_multiplier) != 1.0:
            raise NotExpressible("model.embedding_multiplier", f"{m.embedding_multiplier!r}: Hugging Face {view.name} "
                                 "multiplies embeddings by sqrt(d_model) (mup_enabled) or not at all")
        config["mup_enabled"] = scaled


@dataclass(frozen=True)
class ChannelGatedAttention(Attention):
    """Attention whose output is multiplied channel by channel by sigmoid(gate_proj x) before o_proj (``output_gate``)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        model["block"]["mixer"]["output_gate"] = True

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if not view.uniform("mixer", "output_gate") or view.uniform("mixer", "output_gate_scope") != "channel":
            raise NotExpressible("model.block.mixer.output_gate", f"Hugging Face {view.name}'s attention always gates "
                                 "each channel of its output (output_gate: true, output_gate_scope: channel)")
        super().write(view, config)

    def rules(self) -> list[Rule]:
        return [*super().rules(), Copy(f"{ATTN}.gate_proj.weight", f"{BLOCK_MIXER}.gate.weight")]


@dataclass(frozen=True)
class AfmoeExperts(GroupedExperts):
    """DeepSeek-V3's experts under AfmoeConfig's names, always renormalised, no groups; the router ``router.gate``,
    the selection bias ``expert_bias``, the shared experts ``shared_experts``."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.get_size("num_shared_experts")  # an AFMoE layer always builds its shared experts
        for own, deepseek in EXPERT_NAMES:
            cfg.data[deepseek] = cfg.get(own)
        cfg.data.update(FIXED)
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        for key, wanted in FIXED.items():
            if config.pop(key) != wanted:
                raise NotExpressible("model.block.ffn.router", f"Hugging Face {view.name}'s sigmoid_topk router always "
                                     "renormalises the chosen weights and has no groups (normalize: true, n_group 1)")
        if not config["n_shared_experts"]:
            raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} always has shared "
                                 "experts (n_shared_experts at least 1)")
        for own, deepseek in EXPERT_NAMES:
            config[own] = config.pop(deepseek)

    def rules(self) -> list[Rule]:
        return [
            Copy(f"{MLP}.router.gate.weight", "blocks.{i}.ffn.router.weight"),
            Copy(f"{MLP}.expert_bias", "blocks.{i}.ffn.router.selection_bias"),
            *expert_rules(saved=MLP)[1:],
            Fused([f"{MLP}.shared_experts.gate_proj.weight", f"{MLP}.shared_experts.up_proj.weight"],
                  "blocks.{i}.ffn.shared.gate_up.weight", sizes=shared_halves),
            Copy(f"{MLP}.shared_experts.down_proj.weight", "blocks.{i}.ffn.shared.down.weight"),
            *GatedFFN().rules(),  # the dense first layers
        ]


FAMILY = decoder_family(
    name="AFMoE",
    model_type="afmoe",
    architecture="AfmoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        DefaultLayerTypes(),
        Sizes(),
        MupEmbedding(),
        SlidingRopeGlobalNope(),  # layer_types, always there after DefaultLayerTypes, decide
        Layout("sandwich", names=NORMS),
        RMSNorm(),
        ChannelGatedAttention(),
        QKNorm("head"),
        AfmoeExperts(),
        Refuse("attention_bias", (False,), why="specformer's channel output gate has a bias exactly when q, k and v do, "
                                              "and AFMoE's gate_proj has none"),
    ],
    maps="sandwich RMSNorms (input_layernorm, post_attention_layernorm, pre_mlp_layernorm, post_mlp_layernorm); GQA "
         "with head_dim, qk_norm RMSNorm per head, output_gate (gate_proj: one sigmoid per output channel); layer_types "
         "(default: every global_attn_every_n_layers-th layer global) + sliding_window -> per-layer windows, the rope on "
         "the sliding layers and positional none on the global ones; ffn moe as DeepSeek-V3's: num_experts, "
         "num_experts_per_tok, moe_intermediate_size, router sigmoid_topk (always renormalised, route_scale; "
         "expert_bias -> selection_bias), num_shared_experts ungated shared experts; num_dense_layers -> dense first "
         "layers (intermediate_size); mup_enabled -> embedding_multiplier sqrt_d_model",
    caveats="attention_bias must be false; num_shared_experts must be at least 1; aux_loss_coef is 0 on import; one "
            "sliding_window for every sliding layer, and export needs at least one sliding layer",
)
