"""Mellum (``model_type: mellum``, JetBrains' Mellum MoE): Qwen3-MoE's attention (an RMSNorm per query and key head)
and experts in pre-norm blocks, with full and sliding layers by layer_types, a rope per layer type, dense layers by
mlp_layer_types, and a multi-token-prediction layer that is not part of the causal LM.

transformers 5.25's Mellum routes with Qwen3-MoE's plain softmax top-k (MellumSparseMoeBlock is
Qwen3MoeSparseMoeBlock): the router logit softcap and the router weight on the MoE input that
issue 46 names beside it belong to Laguna, whose config and decoder Mellum's borrow, not to Mellum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import FamilyView, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, MixtureOfExperts
from specformer_hf.parts.mtp import SEPARATE_LAYER, TypedMTP
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.windows import LayerTypeRopes

#: transformers' MellumConfig defaults.
DEFAULTS = {
    "vocab_size": 98304, "hidden_size": 2304, "intermediate_size": 7168, "num_hidden_layers": 28,
    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "sliding_window": 1024, "moe_intermediate_size": 896, "num_experts_per_tok": 8, "num_experts": 64,
    "norm_topk_prob": True, "router_aux_loss_coef": 0.001, "layer_types": None, "mlp_layer_types": None,
    "num_mtp_layers": None, "mtp_layer_types": None, "mtp_mlp_layer_types": None,
}
#: MellumConfig's default rope thetas per layer type.
THETA = {"full_attention": 500_000.0, "sliding_attention": 10_000.0}
#: layer_types -> per-layer windows and a rope per layer type (the MTP layer's type too).
WINDOWS = LayerTypeRopes(pattern=1, theta=THETA, pattern_key=None, flat_is_full=False)


@dataclass(frozen=True)
class MellumExperts(MixtureOfExperts):
    """Qwen3-MoE's experts with mlp_layer_types ("dense" or "sparse" per layer, default all sparse) naming the dense
    layers (SwiGLU of intermediate_size); the multi-token-prediction fields are TypedMTP's."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = cfg.get("mlp_layer_types") or ["sparse"] * n_layers
        if not isinstance(types, list) or len(types) != n_layers or any(t not in ("dense", "sparse") for t in types):
            raise UserError(f"{cfg.family}: mlp_layer_types must give 'dense' or 'sparse' for each of the {n_layers} "
                            f"layers, got {types!r}")
        cfg.data.update(decoder_sparse_step=1, mlp_only_layers=[i for i, t in enumerate(types) if t == "dense"])
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        del config["decoder_sparse_step"]
        dense = config.pop("mlp_only_layers")
        config["mlp_layer_types"] = ["dense" if i in dense else "sparse" for i in range(view.model.n_layers)]


FAMILY = decoder_family(
    name="Mellum",
    model_type="mellum",
    architecture="MellumForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(replace_part(LLAMA_PARTS, MellumExperts(hidden="moe_intermediate_size", normalize="norm_topk_prob",
                                                              dense=True, n_experts="num_local_experts",
                                                              n_experts_aliases=("num_experts",)),
                                   instead_of=GatedFFN),
                      WINDOWS, instead_of=Rope),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("head"),
        # MellumConfig: one MTP layer, sliding (the sliding layers' rope) with experts unless its lists say otherwise.
        TypedMTP(WINDOWS, count="num_mtp_layers", aliases=("num_nextn_predict_layers",),
                 attention_default="sliding_attention", mlp_default="sparse"),
    ],
    mtp_layer=SEPARATE_LAYER,
    maps="as Qwen3-MoE (per-head q/k RMSNorm, attention_bias, head_dim) with ffn moe: num_local_experts / num_experts, "
         "num_experts_per_tok, moe_intermediate_size, norm_topk_prob; mlp_layer_types -> dense SwiGLU layers "
         "(intermediate_size); layer_types (default all full) and sliding_window -> per-layer windows; rope_parameters "
         "per layer type -> per-layer ropes; num_mtp_layers (0 or 1), mtp_layer_types, mtp_mlp_layer_types -> mtp depths "
         "(mtp.fc, pre_fc_norm_embedding, pre_fc_norm_hidden, decoder layer mtp.layers.0, mtp.norm)",
    caveats="a file without the multi-token prediction layer its config counts imports without model.mtp, with a "
            "note; reads per-expert and fused 3-D expert tensors, writes per-expert",
    # transformers' MellumPreTrainedModel ignores mtp.*; import reads them as model.mtp where config.json counts one.
    ignore_tensors=(r"mtp\..*",),
)
