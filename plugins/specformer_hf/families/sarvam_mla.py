"""Sarvam-105B (``model_type: sarvam_mla``): transformers builds DeepseekV3ForCausalLM from SarvamMLAConfig, which
reads the original remote code's config.json spellings (num_experts, a head_dim and q_head_dim it derives itself,
rope_scaling of type ``deepseek_yarn``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families import deepseek_v3
from specformer_hf.parts.base import FamilyView, Part, SavedNames
from specformer_hf.parts.decoder import decoder_family

#: transformers' SarvamMLAConfig defaults (Sarvam-105B's shapes): DeepseekV3Config's, with these changed.
DEFAULTS = {
    **deepseek_v3.DEFAULTS, "vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384,
    "num_hidden_layers": 32, "num_attention_heads": 64, "num_key_value_heads": None, "n_routed_experts": 128,
    "q_lora_rank": None, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "num_mtp_layers": 0,
}

#: SarvamMLAConfig's attribute_map: the names the original sarvamai/sarvam-105b config.json uses.
SAVED_NAMES = (("num_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts"))


@dataclass(frozen=True)
class DeepseekYarn(Part):
    """rope_scaling of type ``deepseek_yarn`` (the remote code's name) read as ``yarn``, as SarvamMLAConfig does:
    the same scaling under another name. Export writes ``yarn``."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        scaling = cfg.data.get("rope_scaling")
        if isinstance(scaling, dict) and "deepseek_yarn" in (scaling.get("type"), scaling.get("rope_type")):
            cfg.data["rope_scaling"] = {**{k: v for k, v in scaling.items() if k != "type"}, "rope_type": "yarn"}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        pass


FAMILY = decoder_family(
    name="Sarvam-105B",
    model_type="sarvam_mla",
    architecture="DeepseekV3ForCausalLM",
    defaults=DEFAULTS,
    parts=[SavedNames(SAVED_NAMES), DeepseekYarn(), *deepseek_v3.PARTS],
    ignore_tensors=deepseek_v3.FAMILY.ignore_tensors,
    # SarvamMLAConfig drops q_head_dim (qk_nope_head_dim + qk_rope_head_dim) and derives head_dim itself.
    non_math_fields=("q_head_dim",),
    maps="as DeepSeek-V3 (transformers builds DeepseekV3ForCausalLM): attention mla, interleaved rope, sigmoid-routed "
         "experts, shared experts, dense first layers; num_experts / num_shared_experts read as n_routed_experts / "
         "n_shared_experts; rope_scaling type deepseek_yarn as yarn",
    caveats="head_dim and q_head_dim of the original config.json are derived sizes, not read (as transformers); "
            "export writes DeepSeek-V3's field names and yarn",
)
