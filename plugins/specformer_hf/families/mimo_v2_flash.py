"""MiMo-V2-Flash (``model_type: mimo_v2_flash``, XiaomiMiMo/MiMo-V2-Flash): pre-norm blocks whose attention has value
heads narrower than its query/key heads (v_head_dim) and scaled values (attention_value_scale), sliding layers with
twice the key/value heads and learned sinks beside full layers, a partial rope per layer type, and DeepSeek-V3's
sigmoid-routed experts (no shared expert) after the dense layers mlp_layer_types names.

transformers 5.25's MiMoV2FlashAttention gives a sliding_attention layer ``2 * num_key_value_heads`` key/value heads
and per-head sinks, a full_attention layer ``num_key_value_heads`` and none; its rope reads partial_rotary_factor per
layer type with 0.334 where a layer type's parameters omit it. Checkpoints name the sinks
``self_attn.attention_sink_bias``; both that and ``sinks`` are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, FamilyView, Fixed, Switch, selection
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, GroupedExperts
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.windows import LAYER_TYPES, LayerTypeRopes, layer_types_from_config
from specformer_hf.rules import Copy, OneOf, Rule
from specformer_hf.specview import NotExpressible

#: MiMoV2FlashConfig's defaults (MiMo-V2-Flash's shapes).
DEFAULTS = {
    "vocab_size": 152576, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 48,
    "num_attention_heads": 64, "num_key_value_heads": 4, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False, "moe_intermediate_size": 2048,
    "num_experts_per_tok": 8, "n_routed_experts": 256, "routed_scaling_factor": 1.0, "n_group": 1, "topk_group": 1,
    "norm_topk_prob": True, "head_dim": 192, "v_head_dim": 128, "sliding_window": 129, "layer_types": None,
    "mlp_layer_types": None, "attention_value_scale": 0.707,
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334},
    },
}
#: The rope fraction MiMoV2FlashRotaryEmbedding takes where a layer type's parameters give none.
DEFAULT_FRACTION = 0.334


def default_layer_types(n_layers: int) -> list[str]:
    """MiMoV2FlashConfig's default: layer 0 and every sixth layer full, the others sliding."""
    return ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention" for i in range(n_layers)]


@dataclass(frozen=True)
class MiMoRopes(LayerTypeRopes):
    """LayerTypeRopes with MiMo's rope fraction: 0.334 where a layer type's parameters omit it, so always written."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        stored = cfg.data.get("rope_parameters")
        if isinstance(stored, dict) and any(t in stored for t in LAYER_TYPES):
            cfg.data["rope_parameters"] = {t: ({"partial_rotary_factor": DEFAULT_FRACTION, **p} if isinstance(p, dict)
                                               else p) for t, p in stored.items()}
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        for params in config["rope_parameters"].values():
            params.setdefault("partial_rotary_factor", 1.0)


@dataclass(frozen=True)
class MiMoAttention(Attention):
    """num_attention_heads, num_key_value_heads (doubled on sliding layers, which also have sinks), head_dim,
    v_head_dim and attention_value_scale <-> the attention's heads, per-layer n_kv_heads and sinks, v_head_dim and
    value_scale."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        mixer = model["block"]["mixer"]
        head_dim = mixer["head_dim"]
        v_head_dim = cfg.get_size("v_head_dim")
        if v_head_dim != head_dim:
            mixer["v_head_dim"] = v_head_dim
        scale = cfg.get("attention_value_scale")
        if scale is not None and float(scale) != 1.0:  # transformers takes null as 1
            mixer["value_scale"] = float(scale)
        n_layers = cfg.get_layers("num_hidden_layers")
        types = layer_types_from_config(cfg, default_layer_types(n_layers))
        sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
        if sliding:
            if mixer["n_heads"] % (2 * mixer["n_kv_heads"]):
                raise UserError(f"{cfg.family}: sliding layers have 2 * num_key_value_heads "
                                f"({2 * mixer['n_kv_heads']}) key/value heads, which must divide num_attention_heads "
                                f"({mixer['n_heads']})")
            model.setdefault("layers", []).append({"select": selection(sliding, n_layers), "mixer": {
                "n_kv_heads": 2 * mixer["n_kv_heads"], "sinks": True}})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("mixer", ("attention",))
        for key in ("n_heads", "head_dim", "v_head_dim", "value_scale"):
            view.uniform("mixer", key)
        windows = view.per_layer("mixer", "window")
        kv_heads = view.per_layer("mixer", "n_kv_heads")
        sinks = view.per_layer("mixer", "sinks")
        n_heads, _, head_dim = view.attention_sizes()
        full_kv = {kv or n_heads for kv, w in zip(kv_heads, windows) if w is None}
        sliding_kv = {kv or n_heads for kv, w in zip(kv_heads, windows) if w is not None}
        base = full_kv or {k // 2 for k in sliding_kv}
        if len(base) != 1 or any(k != 2 * next(iter(base)) for k in sliding_kv):
            raise NotExpressible("model.layers[*].mixer.n_kv_heads", f"Hugging Face {view.name} has n_kv_heads on "
                                 f"its full layers and twice as many on its sliding ones, got {kv_heads}")
        for i, (window, sink) in enumerate(zip(windows, sinks)):
            if bool(sink) != (window is not None):
                raise NotExpressible(f"model.layers[{i}].mixer.sinks", f"Hugging Face {view.name} has sinks on its "
                                     "sliding layers and on no full layer")
        mixer = view.view.layers[0]["mixer"]
        config.update(num_attention_heads=n_heads, num_key_value_heads=base.pop(), head_dim=head_dim,
                      v_head_dim=mixer.get("v_head_dim") or head_dim,
                      attention_value_scale=mixer.get("value_scale", 1.0))

    def rules(self) -> list[Rule]:
        # Checkpoints name the sinks attention_sink_bias (transformers renames them sinks on load, back on save).
        sinks = f"{BLOCK_MIXER}.sinks"
        return [*super().rules(), OneOf(Copy(f"{ATTN}.attention_sink_bias", sinks), Copy(f"{ATTN}.sinks", sinks))]


@dataclass(frozen=True)
class MiMoExperts(GroupedExperts):
    """DeepSeek-V3's experts without a shared one; mlp_layer_types (default: the first layer dense) names the dense
    layers, which transformers' MiMo-V2-Flash allows anywhere and this mapping at the start only."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = cfg.get("mlp_layer_types") or ["dense"] + ["sparse"] * (n_layers - 1)
        if not isinstance(types, list) or len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
            raise UserError(f"{cfg.family}: mlp_layer_types must give 'dense' or 'sparse' for each of the {n_layers} "
                            f"layers, got {types!r}")
        dense = types.count("dense")
        if types != ["dense"] * dense + ["sparse"] * (n_layers - dense):
            raise UserError(f"{cfg.family}: mlp_layer_types {types} puts a dense layer after a sparse one; this mapping "
                            "supports dense layers first only (DeepSeek-V3's first_k_dense_replace)")
        cfg.data.update(first_k_dense_replace=dense, n_shared_experts=0)
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        if config.pop("n_shared_experts"):
            raise NotExpressible("model.block.ffn.n_shared_experts", f"Hugging Face {view.name} has no shared expert")
        dense = config.pop("first_k_dense_replace")
        config["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (view.model.n_layers - dense)


FAMILY = decoder_family(
    name="MiMo-V2-Flash",
    model_type="mimo_v2_flash",
    architecture="MiMoV2FlashForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(replace_part(LLAMA_PARTS, MiMoAttention(), instead_of=Attention), MiMoExperts(), instead_of=GatedFFN),
                      MiMoRopes(pattern=1 << 30, theta={"full_attention": 5_000_000.0, "sliding_attention": 10_000.0},
                                pattern_key=None, flat_is_full=False, partial=True), instead_of=Rope),
        Switch("attention_bias", ("mixer.qkv_bias",)),
        Fixed("mixer.out_bias", False, why="has no bias on o_proj (attention_bias is on q, k and v only)"),
    ],
    maps="attention with head_dim (queries, keys) and v_head_dim (values), attention_value_scale -> value_scale, "
         "attention_bias on q/k/v; layer_types (default: layer 0 and every sixth full) + sliding_window -> per-layer "
         "windows, the sliding layers with 2 * num_key_value_heads and sinks; rope_parameters per layer type (partial, "
         "0.334 by default) -> per-layer ropes; ffn moe as DeepSeek-V3's without shared experts (sigmoid_topk, "
         "e_score_correction_bias -> selection_bias, n_group, topk_group, norm_topk_prob, routed_scaling_factor); "
         "mlp_layer_types -> dense first layers (intermediate_size)",
    caveats="the multi-token-prediction layers (model.mtp.*) are skipped, as transformers skips them; dense layers "
            "only before the sparse ones; aux_loss_coef is 0 on import",
    ignore_tensors=(r"model\.mtp\..*",),
)
