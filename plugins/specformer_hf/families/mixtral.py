"""Mixtral (``model_type: mixtral``): Mistral's attention with a top-k routed mixture of SwiGLU experts."""

from __future__ import annotations

from specformer_hf.parts.base import LAYER, Value
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.feedforward import GatedFFN, MixtureOfExperts

#: transformers' MixtralConfig defaults.
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "sliding_window": None, "num_experts_per_tok": 2, "num_local_experts": 8, "router_aux_loss_coef": 0.001,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
}

FAMILY = decoder_family(
    name="Mixtral",
    model_type="mixtral",
    architecture="MixtralForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, MixtureOfExperts(n_experts="num_local_experts", saved=f"{LAYER}.block_sparse_moe",
                                                    gate="w1", up="w3", down="w2"),
                     instead_of=GatedFFN),
        Value("sliding_window", "mixer.window"),
    ],
    maps="as Mistral with ffn moe: num_local_experts, num_experts_per_tok, softmax-then-top-k routing renormalised "
         "(Mixtral's router), SwiGLU experts, router_aux_loss_coef -> aux_loss_coef",
    caveats="reads the per-expert layout transformers saves (block_sparse_moe.experts.j.w1/w2/w3) and the fused 3-D "
            "one of its modules (mlp.experts.gate_up_proj/down_proj); writes the per-expert one",
)
