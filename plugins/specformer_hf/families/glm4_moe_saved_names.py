"""The tensor names Sarvam-30B and Param2 checkpoints keep (the original remote code's), over GLM-4.5's rules.

transformers runs both as Glm4MoeForCausalLM and renames on load, back on save (its conversion
mapping for ``sarvam_moe``, which ``param2moe`` copies): ``model.word_embeddings``, one fused
``attention.query_key_value`` (rows ``[q | k | v]``, as our ``qkv``), ``attention.dense``,
``attention.query_layernorm`` / ``key_layernorm`` and ``mlp.gate.expert_bias``.
"""

from __future__ import annotations

import re

from specformer_hf.families import glm4_moe
from specformer_hf.parts.base import BLOCK_MIXER
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


__all__ = ["RENAMES", "saved_name", "saved_rules"]
