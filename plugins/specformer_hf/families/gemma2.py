"""Gemma 2 (``model_type: gemma2``): sandwich norms, soft-capped attention and logits, alternating sliding windows."""

from __future__ import annotations

from specformer_hf.parts.attention import QueryScale
from specformer_hf.parts.base import Refuse, Switch, Value
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.embedding import EmbeddingScale
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.windows import LayerTypes

#: transformers' Gemma2Config defaults.
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": None, "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0, "use_bidirectional_attention": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

PARTS = replace_part(replace_part(replace_part(LLAMA_PARTS, Layout("sandwich")), RMSNorm(offset=1.0)),
                     GatedFFN(act_key="hidden_activation", gemma_gelu=True))

#: Gemma 2's decoder (VaultGemma's too, with another layout).
GEMMA2_PARTS = (
    *PARTS,
    EmbeddingScale(),
    Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
    Value("attn_logit_softcapping", "mixer.logit_softcap"),
    Value("final_logit_softcapping", "logit_softcap"),
    QueryScale(),
    # Even layers slide, odd layers see everything (Gemma2Config's default layer_types).
    LayerTypes(sliding=lambda i: (i + 1) % 2 == 1, required=True),
)

FAMILY = decoder_family(
    name="Gemma 2",
    model_type="gemma2",
    architecture="Gemma2ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Refuse("use_bidirectional_attention", (None, False), why="Gemma 2 with bidirectional attention is not a causal LM"),
        *GEMMA2_PARTS,
    ],
    maps="as Gemma with layout sandwich, attn_logit_softcapping -> attention logit_softcap, final_logit_softcapping -> "
         "logit_softcap, query_pre_attn_scalar -> scale, layer_types + sliding_window -> per-layer windows",
    caveats="soft-capped attention runs the eager (explicit softmax) path, as in transformers",
)
