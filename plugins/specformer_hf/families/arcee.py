"""Arcee (``model_type: arcee``, AFM-4.5B): Llama with an ungated MLP, up_proj then down_proj, squared ReLU."""

from __future__ import annotations

from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import PlainMLP
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import Rope

#: transformers' ArceeConfig defaults (AFM-4.5B's sizes, its docstring says).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 2560, "intermediate_size": 18432, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "relu2",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

#: Arcee's decoder (Jais 2 swaps its norms for LayerNorms).
PARTS = (
    Sizes(),
    Rope(),
    Layout("prenorm"),
    RMSNorm(),
    Attention(),
    PlainMLP(fc_in="up_proj", fc_out="down_proj"),
    Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
    Switch("mlp_bias", ("ffn.bias",)),
)

FAMILY = decoder_family(
    name="Arcee",
    model_type="arcee",
    architecture="ArceeForCausalLM",
    defaults=DEFAULTS,
    parts=PARTS,
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="as Llama (prenorm RMSNorm, rope, GQA, head_dim, attention_bias, mlp_bias) with an ungated mlp (up_proj, "
         "down_proj; hidden_act, relu2 by default), tied or untied head",
    caveats="attention_bias applies to q, k, v and o alike (as in transformers)",
)
