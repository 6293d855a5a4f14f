"""The tensor names Sarvam-30B and Param2 checkpoints keep (the original remote code's), over GLM-4.5's rules.

transformers runs both as Glm4MoeForCausalLM and renames on load, back on save (its conversion
mapping for ``sarvam_moe``, which ``param2moe`` copies): ``model.word_embeddings``, one fused
``attention.query_key_value`` (rows ``[q | k | v]``, as our ``qkv``), ``attention.dense``,
``attention.query_layernorm`` / ``key_layernorm`` and ``mlp.gate.expert_bias``.
"""

from __future__ import annotations

import re
from typing import Any

from specformer_hf.families import glm4_moe
from specformer_hf.family import Family
from specformer_hf.parts.base import BLOCK_MIXER, SavedNames
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.rules import Copy, Rule, renamed

#: GLM-4.5's name -> the saved one (regular expressions, applied in order), as transformers' conversion reverses.
RENAMES = (
    (r"^model\.embed_tokens\.", "model.word_embeddings."),
    (r"\.self_attn\.o_proj\.", ".attention.dense."),
    (r"\.self_attn\.q_norm\.", ".attention.query_layernorm."),
    (r"\.self_attn\.k_norm\.", ".attention.key_layernorm."),
    (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.gate.expert_bias"),
    (r"\.self_attn\.", ".attention."),
)

QKV = (f"{BLOCK_MIXER}.qkv.weight", f"{BLOCK_MIXER}.qkv.bias")


def saved_name(name: str) -> str:
    for pattern, replacement in RENAMES:
        name = re.sub(pattern, replacement, name)
    return name


def saved_rules() -> list[Rule]:
    """GLM-4.5's rules under the saved names; q, k and v read from (and written as) the one fused tensor."""
    rules: list[Rule] = [Copy(f"model.layers.{{i}}.attention.query_key_value.{p}", f"{BLOCK_MIXER}.qkv.{p}")
                         for p in ("weight", "bias")]
    return rules + [renamed(rule, saved_name) for rule in glm4_moe.FAMILY.weights if rule.ours[0] not in QKV]


#: The original config.json's names for three GLM-4.5 fields (the config classes' attribute_map), both families alike.
SAVED_NAMES = (("num_experts", "n_routed_experts"), ("num_shared_experts", "n_shared_experts"),
               ("use_qkv_bias", "attention_bias"))


def saved_names_family(*, name: str, model_type: str, defaults: dict[str, Any]) -> Family:
    """A GLM-4.5 family whose config.json and tensors use the original remote code's names (Sarvam-30B, Param2)."""
    return decoder_family(
        name=name,
        model_type=model_type,
        architecture="Glm4MoeForCausalLM",
        defaults=defaults,
        parts=[SavedNames(SAVED_NAMES), *glm4_moe.PARTS],
        rules=saved_rules(),
        ignore_tensors=glm4_moe.FAMILY.ignore_tensors,
        maps="as GLM-4.5 (transformers builds Glm4MoeForCausalLM): partial_rotary_factor (default 1.0: whole heads), "
             "use_qk_norm (default on), q/k/v biases, sigmoid-routed experts, shared experts, dense first layers; "
             "num_experts, num_shared_experts, use_qkv_bias read as n_routed_experts, n_shared_experts, attention_bias; "
             "the tensors under the original names (model.word_embeddings, attention.query_key_value fused, "
             "attention.dense, attention.query_layernorm / key_layernorm, mlp.gate.expert_bias)",
        caveats="as GLM-4.5; export writes GLM-4.5's field names and the original tensor names, as transformers' "
                "save_pretrained does",
    )


__all__ = ["RENAMES", "SAVED_NAMES", "saved_name", "saved_names_family", "saved_rules"]
