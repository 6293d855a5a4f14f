"""nanochat (``model_type: nanochat``, karpathy/nanochat): Llama-like blocks where no norm learns a weight.

A weightless RMSNorm on the token embeddings, before every sublayer, on each head's queries and keys (after
the rope, which commutes with it) and at the end; rope turning the other way (``rotate_half`` is
``cat(x2, -x1)``: the q and k rows of each head's second half are negated on the way in and out); an
ungated squared-ReLU MLP (``fc1``, ``fc2``, no biases); soft-capped logits.
"""

from __future__ import annotations

from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, MLP, Fixed, Switch, Value
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import PlainMLP
from specformer_hf.parts.norms import Layout, WeightlessRMSNorms
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, ReversedRopeQK

#: transformers' NanoChatConfig defaults (its docstring names karpathy/nanochat-d32; the sizes are a d12's).
DEFAULTS = {
    "vocab_size": 50304, "hidden_size": 768, "intermediate_size": 8192, "num_hidden_layers": 12,
    "num_attention_heads": 6, "num_key_value_heads": None, "max_position_embeddings": 2048, "hidden_act": "relu2",
    "rms_norm_eps": 1e-6, "final_logit_softcapping": 15.0, "attention_bias": False, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

MLP_PART = PlainMLP(fc_in="fc1", fc_out="fc2")

FAMILY = decoder_family(
    name="nanochat",
    model_type="nanochat",
    architecture="NanoChatForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Rope(),
        Layout("prenorm"),
        WeightlessRMSNorms(),
        Attention(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        MLP_PART,
        Fixed("ffn.bias", False, why="has no MLP biases"),
        Value("final_logit_softcapping", "logit_softcap"),
    ],
    rules=[
        Copy("model.embed_tokens.weight", "embedding.weight"),
        ReversedRopeQK([f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"],
                       f"{BLOCK_MIXER}.qkv.weight"),
        ReversedRopeQK([f"{ATTN}.q_proj.bias", f"{ATTN}.k_proj.bias", f"{ATTN}.v_proj.bias"], f"{BLOCK_MIXER}.qkv.bias"),
        Copy(f"{ATTN}.o_proj.weight", f"{BLOCK_MIXER}.out.weight"),
        Copy(f"{ATTN}.o_proj.bias", f"{BLOCK_MIXER}.out.bias"),
        Copy(f"{MLP}.fc1.weight", "blocks.{i}.ffn.fc_in.weight"),
        Copy(f"{MLP}.fc2.weight", "blocks.{i}.ffn.fc_out.weight"),
        Copy("lm_head.weight", "lm_head.weight"),
    ],
    maps="rms_norm_eps -> weightless RMSNorms (rmsnorm weight false) on the token embeddings (model.embedding_norm), "
         "before each sublayer, on each head's q and k (qk_norm; after the rope there, which commutes with it) and "
         "at the end; rope, its reversed rotate_half as the q/k rows of each head's second half negated; GQA, "
         "attention_bias on q, k, v and o; an ungated mlp (fc1, fc2, hidden_act relu2, no biases); "
         "final_logit_softcapping -> logit_softcap",
    caveats="every norm shares rms_norm_eps; the MLP never has biases",
)
