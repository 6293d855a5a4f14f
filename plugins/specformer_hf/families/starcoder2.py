"""StarCoder2 (``model_type: starcoder2``): Mistral's attention and window, LayerNorm with biases, a plain GELU MLP,
and biases on every projection (use_bias)."""

from __future__ import annotations

from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import Switch, Value
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import PlainMLP
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import Rope

#: transformers' Starcoder2Config defaults (StarCoder2-7B's sizes; its published rope_theta is 1e6, not the default).
DEFAULTS = {
    "vocab_size": 49152, "hidden_size": 3072, "intermediate_size": 12288, "num_hidden_layers": 30,
    "num_attention_heads": 24, "num_key_value_heads": 2, "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 4096, "norm_epsilon": 1e-5, "tie_word_embeddings": True, "sliding_window": None,
    "use_bias": True, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="StarCoder2",
    model_type="starcoder2",
    architecture="Starcoder2ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Rope(),
        # nn.LayerNorm with its bias whatever use_bias says: use_bias is for the linear layers only.
        Layout("prenorm", norm_bias=True),
        LayerNorm(eps_key="norm_epsilon"),
        Attention(),
        PlainMLP(fc_in="c_fc", fc_out="c_proj"),
        Switch("use_bias", ("mixer.qkv_bias", "mixer.out_bias", "ffn.bias")),
        Value("sliding_window", "mixer.window"),
    ],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    non_math_fields=("residual_dropout", "embedding_dropout"),
    maps="LayerNorm with biases (norm_epsilon), rope (theta), GQA, use_bias -> biases on q, k, v, o and both MLP "
         "projections, a plain MLP (c_fc, c_proj; gelu_pytorch_tanh), sliding_window on every layer (null: full "
         "attention), tied or untied head",
    caveats="use_bias switches every linear layer's bias together; a key is visible to a query when query - key < "
            "sliding_window, as in transformers 5",
)
