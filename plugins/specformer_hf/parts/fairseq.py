"""The decoder layer as fairseq and BART name its tensors, which OPT, BioGPT and XGLM kept: one table of rules.

``self_attn_layer_norm`` before the attention (separate q/k/v projections, ``out_proj``, all
with biases) and ``final_layer_norm`` before the MLP (``fc1``, ``fc2``, with biases): in a
pre-norm fairseq layer "final" is the norm before the MLP, not after the stack.
"""

from __future__ import annotations

from specformer_hf.parts.base import BLOCK_MIXER
from specformer_hf.rules import Copy, Fused, Rule, qkv_sizes


def fairseq_layer_rules(layer: str) -> list[Rule]:
    """The rules of one fairseq-named pre-norm decoder layer whose tensors start with ``layer`` (``...layers.{i}``)."""
    attention = f"{layer}.self_attn"
    return [
        Copy(f"{layer}.self_attn_layer_norm.weight", "blocks.{i}.attention_norm.weight"),
        Copy(f"{layer}.self_attn_layer_norm.bias", "blocks.{i}.attention_norm.bias"),
        Fused([f"{attention}.q_proj.weight", f"{attention}.k_proj.weight", f"{attention}.v_proj.weight"],
              f"{BLOCK_MIXER}.qkv.weight", sizes=qkv_sizes),
        Fused([f"{attention}.q_proj.bias", f"{attention}.k_proj.bias", f"{attention}.v_proj.bias"],
              f"{BLOCK_MIXER}.qkv.bias", sizes=qkv_sizes),
        Copy(f"{attention}.out_proj.weight", f"{BLOCK_MIXER}.out.weight"),
        Copy(f"{attention}.out_proj.bias", f"{BLOCK_MIXER}.out.bias"),
        Copy(f"{layer}.final_layer_norm.weight", "blocks.{i}.ffn_norm.weight"),
        Copy(f"{layer}.final_layer_norm.bias", "blocks.{i}.ffn_norm.bias"),
        Copy(f"{layer}.fc1.weight", "blocks.{i}.ffn.fc_in.weight"),
        Copy(f"{layer}.fc1.bias", "blocks.{i}.ffn.fc_in.bias"),
        Copy(f"{layer}.fc2.weight", "blocks.{i}.ffn.fc_out.weight"),
        Copy(f"{layer}.fc2.bias", "blocks.{i}.ffn.fc_out.bias"),
    ]


__all__ = ["fairseq_layer_rules"]
