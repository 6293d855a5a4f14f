"""VaultGemma (``model_type: vaultgemma``, google/vaultgemma-1b): Gemma 2 with pre-norm blocks.

Gemma 2's decoder (:data:`specformer_hf.families.gemma2.GEMMA2_PARTS`: (1 + w) RMSNorms, the embedding
scale, soft-capped attention and logits, query_pre_attn_scalar, layer_types windows, a GELU-tanh gated
MLP) whose layers drop the sandwich's post-norms: ``input_layernorm`` before the attention,
``pre_feedforward_layernorm`` before the MLP, nothing after either.
"""

from __future__ import annotations

from specformer_hf.families import gemma2
from specformer_hf.parts.decoder import decoder_family, replace_part
from specformer_hf.parts.norms import Layout

#: transformers' VaultGemmaConfig defaults: Gemma2Config's (Gemma-2-2B's sizes), without use_bidirectional_attention.
DEFAULTS = {k: v for k, v in gemma2.DEFAULTS.items() if k != "use_bidirectional_attention"}

FAMILY = decoder_family(
    name="VaultGemma",
    model_type="vaultgemma",
    architecture="VaultGemmaForCausalLM",
    defaults=DEFAULTS,
    parts=replace_part(gemma2.GEMMA2_PARTS, Layout(
        "prenorm", names=(("attention_norm", "input_layernorm"), ("ffn_norm", "pre_feedforward_layernorm")))),
    maps="as gemma2 with layout prenorm (input_layernorm, pre_feedforward_layernorm; no post-norms)",
    caveats="soft-capped attention runs the eager (explicit softmax) path, as in transformers",
)
