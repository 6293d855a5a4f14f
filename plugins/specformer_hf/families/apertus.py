"""Apertus (``model_type: apertus``, Apertus-8B and -70B): Llama's attention with an RMSNorm per query and key head,
and an ungated MLP whose activation is xIELU, learned per layer."""

from __future__ import annotations

from specformer_hf.parts.attention import Attention, QKNorm
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.xielu import XIELUMLP

#: transformers' ApertusConfig defaults (Apertus-8B's sizes).
DEFAULTS = {
    "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "xielu",
    "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 12000000.0, "factor": 8.0,
                        "original_max_position_embeddings": 8192, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
}

#: What Apertus is made of (Apertus 1.5's text model is the same): sizes, rope, pre-norm RMSNorm blocks under
#: its own norm names, attention with q/k RMSNorm per head before RoPE, the xIELU MLP.
APERTUS_PARTS = (
    Sizes(), Rope(),
    Layout("prenorm", names=(("attention_norm", "attention_layernorm"), ("ffn_norm", "feedforward_layernorm"))),
    RMSNorm(), Attention(), QKNorm("head"), XIELUMLP(fc_in="up_proj", fc_out="down_proj"),
    Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
)
MAPS = ("as Llama (rope, llama3 scaling by default, GQA, head_dim, attention_bias) with attention_layernorm / "
        "feedforward_layernorm as the prenorm RMSNorms, qk_norm RMSNorm per head before RoPE (eps rms_norm_eps), and "
        "an ungated mlp without biases (up_proj, down_proj) whose hidden_act xielu is the learned xielu activation "
        "(mlp.act_fn.alpha_p, alpha_n)")
CAVEATS = ("xIELU's beta and eps are transformers' constants (0.5, -1e-6): the checkpoint's copies (mlp.act_fn.beta, "
           "eps) are checked against them on import and written on export; another hidden_act gives a fixed activation; attention_bias applies to q, k, v and o")

FAMILY = decoder_family(
    name="Apertus",
    model_type="apertus",
    architecture="ApertusForCausalLM",
    defaults=DEFAULTS,
    parts=APERTUS_PARTS,
    maps=MAPS,
    caveats=CAVEATS,
)
