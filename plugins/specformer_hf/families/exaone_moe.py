"""K-EXAONE (``model_type: exaone_moe``, K-EXAONE-236B-A23B): EXAONE 4's attention (per-head q/k RMSNorm, sliding
layers with rope, global layers without) in pre-norm blocks, over DeepSeek-V3's sigmoid-routed experts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families.deepseek_v32 import LayerTypedExperts
from specformer_hf.parts.attention import QKNorm
from specformer_hf.parts.base import MLP, FamilyView, Part
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.mtp import PUBLISHED_COUNT, SEPARATE_LAYER, TypedMTP
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.windows import SlidingRopeGlobalNope
from specformer_hf.rules import Copy, OneOf, Rule

#: transformers' ExaoneMoeConfig defaults (the rest of EXAONE 4's config, which it extends).
DEFAULTS = {
    "vocab_size": 102400, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 32, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": 4096, "sliding_window_pattern": 4,
    "layer_types": None, "mlp_layer_types": None, "first_k_dense_replace": 1, "moe_intermediate_size": 1024,
    "num_experts": 64, "num_experts_per_tok": 8, "num_shared_experts": 1, "norm_topk_prob": True,
    "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

#: ExaoneMoeConfig's names for DeepSeek-V3's expert counts: (its name, the parts' name).
EXPERT_NAMES = (("num_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts"))


@dataclass(frozen=True)
class ExpertNames(Part):
    """num_experts and num_shared_experts, read under DeepSeek-V3's names for the experts part (placed before it)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        for own, deepseek in EXPERT_NAMES:
            cfg.data[deepseek] = cfg.get(own)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        pass


@dataclass(frozen=True)
class ExpertNamesWritten(Part):
    """The experts part's DeepSeek-V3 names written back as ExaoneMoeConfig's (placed after it)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        pass

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        for own, deepseek in EXPERT_NAMES:
            config[own] = config.pop(deepseek)


@dataclass(frozen=True)
class ExaoneExperts(LayerTypedExperts):
    """DeepSeek-V3's experts, the selection bias saved as ``mlp.e_score_correction_bias`` (transformers' module holds
    it as ``mlp.gate.e_score_correction_bias``, and a file saved from it as it is too)."""

    def rules(self) -> list[Rule]:
        bias = f"{MLP}.gate.e_score_correction_bias"
        ours = "blocks.{i}.ffn.router.selection_bias"
        return [*(rule for rule in super().rules() if not (isinstance(rule, Copy) and rule.hf == (bias,))),
                OneOf(Copy(f"{MLP}.e_score_correction_bias", ours), Copy(bias, ours))]


#: EXAONE 4's windows: rope on the sliding layers, none on the global ones (all of them, where there is no window).
WINDOWS = SlidingRopeGlobalNope(rope_without_window=True)

# ExaoneMoeConfig has no head_dim field, but the attention reads one if config.json has it (Attention does).
FAMILY = decoder_family(
    name="K-EXAONE",
    model_type="exaone_moe",
    architecture="ExaoneMoeForCausalLM",
    defaults=DEFAULTS,
    parts=[
        ExpertNames(),
        *replace_part(replace_part(LLAMA_PARTS, WINDOWS, instead_of=Rope), ExaoneExperts(), instead_of=GatedFFN),
        QKNorm("head"),
        ExpertNamesWritten(),
        # vLLM's exaone_moe_mtp: Qwen3-Next's layout, a global layer (no rope) with a dense MLP by default.
        TypedMTP(WINDOWS, count=PUBLISHED_COUNT),
    ],
    mtp_layer=SEPARATE_LAYER,
    maps="as EXAONE 4's attention (qk_norm RMSNorm per head, GQA; layer_types or sliding_window_pattern and "
         "sliding_window -> per-layer windows, rope on the sliding layers and none on the global ones) in prenorm "
         "blocks; ffn moe as DeepSeek-V3's: num_experts, num_experts_per_tok, moe_intermediate_size, router "
         "sigmoid_topk (norm_topk_prob, routed_scaling_factor, n_group, topk_group; e_score_correction_bias -> "
         "selection_bias), num_shared_experts; mlp_layer_types (or first_k_dense_replace) -> dense first layers; "
         "num_nextn_predict_layers (0 or 1), mtp_layer_types, mtp_mlp_layer_types -> mtp depths (mtp.fc, "
         "pre_fc_norm_embedding, pre_fc_norm_hidden, decoder layer mtp.layers.0, mtp.norm)",
    caveats="no biases; dense layers must come first in mlp_layer_types; aux_loss_coef is 0 on import; a file without "
            "the multi-token prediction layer its config counts imports without model.mtp, with a note",
    # transformers' ExaoneMoePreTrainedModel ignores exactly these tensors (_keys_to_ignore_on_load_unexpected); import
    # reads them as model.mtp where config.json counts the layer.
    ignore_tensors=(r"mtp\..*",),
)
