"""Nemotron (``model_type: nemotron``, Nemotron-4, Minitron): LayerNorm1P (scale 1 + w) with biases, partial rotary,
an ungated squared-ReLU MLP (up_proj, down_proj)."""

from __future__ import annotations

from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import PlainMLP
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import Rope

#: transformers' NemotronConfig defaults (Nemotron-4 15B's sizes; partial_rotary_factor 0.5 unless the config says).
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 6144, "intermediate_size": 24576, "num_hidden_layers": 32,
    "num_attention_heads": 48, "num_key_value_heads": None, "head_dim": None, "hidden_act": "relu2",
    "max_position_embeddings": 4096, "norm_eps": 1e-5, "tie_word_embeddings": False,
    "attention_bias": False, "mlp_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}

FAMILY = decoder_family(
    name="Nemotron",
    model_type="nemotron",
    architecture="NemotronForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Rope(partial=True, write_fraction=True),
        Layout("prenorm", norm_bias=True),
        LayerNorm(eps_key="norm_eps", offset=1.0),
        Attention(),
        PlainMLP(fc_in="up_proj", fc_out="down_proj"),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        Switch("mlp_bias", ("ffn.bias",)),
    ],
    maps="LayerNorm1P (layernorm offset 1: stored w, applied as 1 + w) with biases, norm_eps; rope with "
         "partial_rotary_factor (default 0.5); GQA, head_dim, attention_bias; an ungated mlp (up_proj, down_proj; "
         "hidden_act, relu2 by default), mlp_bias; tied or untied head",
    caveats="attention_bias applies to q, k, v and o alike (as in transformers); export always writes "
            "partial_rotary_factor (a missing one means 0.5)",
)
