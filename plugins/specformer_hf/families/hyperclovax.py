"""HyperCLOVA X (``model_type: hyperclovax``, HyperCLOVAX-SEED-Think-14B): Granite's muP multipliers on peri-layer norms.

Granite 3's decoder (Llama's rope, grouped-query attention and SwiGLU; the multipliers of
:mod:`specformer_hf.parts.multipliers`) with two changes: ``use_post_norm`` (on by default) adds
an RMSNorm after each sublayer, before ``residual_multiplier`` scales its output into the stream
(the sandwich layout with its ``residual_multiplier``), and ``logits_scaling`` multiplies the
logits where Granite divides them. ``attention_multiplier`` left out (None) is ``head_dim ** -0.5``.
"""

from __future__ import annotations

from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.multipliers import AttentionMultiplier, Multipliers, ScaledResiduals
from specformer_hf.parts.norms import RMSNorm
from specformer_hf.parts.positions import Rope

#: transformers' HyperCLOVAXConfig defaults (Granite's, Llama-2-7B's sizes; a saved config.json may leave any out).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0, "attention_multiplier": None,
    "use_post_norm": True,
}

#: HyperCLOVAXDecoderLayer's norms: post_norm1/2 after the attention and the MLP; post_attention_layernorm is the
#: MLP's pre-norm.
SANDWICH_NAMES = (("attention_norm", "input_layernorm"), ("attention_post_norm", "post_norm1"),
                  ("ffn_norm", "post_attention_layernorm"), ("ffn_post_norm", "post_norm2"))

FAMILY = decoder_family(
    name="HyperCLOVA X",
    model_type="hyperclovax",
    architecture="HyperCLOVAXForCausalLM",
    defaults=DEFAULTS,
    parts=[Sizes(), Rope(), ScaledResiduals(post_norm_key="use_post_norm", sandwich_names=SANDWICH_NAMES), RMSNorm(),
           Attention(), AttentionMultiplier(), Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
           Multipliers(logits_multiplied=True), GatedFFN(bias_key="mlp_bias")],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="Granite's fields; use_post_norm -> layout sandwich (post_norm1, post_norm2) or prenorm; residual_multiplier "
         "-> layout.residual_multiplier (after the post norm); attention_multiplier -> mixer.scale; "
         "logits_scaling -> logit_scale (a multiplier here)",
    caveats="attention_bias applies to q, k, v and o alike (as in transformers); export always writes "
            "attention_multiplier",
)
