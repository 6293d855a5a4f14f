"""Gemma 3 text (``model_type: gemma3_text``, ``Gemma3ForCausalLM``): Gemma 2's sandwich blocks with (1 + w) RMSNorm on
query and key heads, five sliding-window layers to one global layer, and a rope of its own for each kind of layer."""

from __future__ import annotations

from specformer_hf.parts.attention import QKNorm, QueryScale
from specformer_hf.parts.base import Fixed, Refuse, Switch, Value
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.embedding import EmbeddingScale
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.parts.windows import LayerTypeRopes

#: transformers' Gemma3TextConfig defaults (its rope defaults: 10k for sliding layers, 1M for global ones).
DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": None, "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "use_bidirectional_attention": False,
}
THETA = {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}


PARTS = replace_part(replace_part(replace_part(LLAMA_PARTS, Layout("sandwich")), RMSNorm(offset=1.0)),
                     GatedFFN(act_key="hidden_activation", gemma_gelu=True))

FAMILY = decoder_family(
    name="Gemma 3",
    model_type="gemma3_text",
    architecture="Gemma3ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Refuse("use_bidirectional_attention", (None, False), why="Gemma 3 with bidirectional attention is not a causal LM"),
        *replace_part(PARTS, LayerTypeRopes(pattern=6, theta=THETA, local_theta_key="rope_local_base_freq"), instead_of=Rope),
        EmbeddingScale(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        QKNorm("head", offset=1.0),
        QueryScale(),
        # transformers 5.24's Gemma3Attention keeps attn_logit_softcapping but never passes it to any attention
        # kernel (eager included), unlike Gemma 2's; Google's reference would apply it. Every published Gemma 3
        # config has null, so a value is refused rather than read one way or the other.
        Refuse("attn_logit_softcapping", (None,),
               why="transformers' Gemma 3 stores it but never applies it (in any attention implementation), so such a "
                   "config has no agreed meaning; every published Gemma 3 config has null"),
        Fixed("mixer.logit_softcap", None, why="does not soft-cap attention scores (transformers ignores "
                                                   "attn_logit_softcapping in Gemma 3)"),
        Value("final_logit_softcapping", "logit_softcap"),
    ],
    maps="as Gemma 2 (sandwich norms, (1 + w) RMSNorm, sqrt(d) embeddings, query_pre_attn_scalar) with qk_norm "
         "((1 + w) RMSNorm per head), layer_types / sliding_window_pattern -> per-layer windows, and "
         "rope_parameters per layer type (or rope_theta + rope_scaling and rope_local_base_freq) -> per-layer positional",
    caveats="text only (Gemma3ForCausalLM); model_type gemma3_text; attn_logit_softcapping must be null (transformers "
            "never applies it to Gemma 3)",
)
