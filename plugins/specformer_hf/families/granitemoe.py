"""Granite 3 MoE (``model_type: granitemoe``, granite-3.0-1b-a400m, -3b-a800m, PowerMoE): Granite with experts.

Granite 3's decoder (:data:`specformer_hf.families.granite.GRANITE_PARTS`: Llama's blocks with
the muP multipliers) whose feed-forward is a mixture of ``num_local_experts`` SwiGLU experts in
every layer, in Granite's fused expert layout (:class:`~specformer_hf.parts.feedforward.GraniteExperts`).
"""

from __future__ import annotations

from specformer_hf.families.granite import GRANITE_PARTS
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.feedforward import GraniteExperts

#: transformers' GraniteMoeConfig defaults (a saved config.json may leave any of these out).
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "embedding_multiplier": 1.0, "logits_scaling": 1.0, "residual_multiplier": 1.0, "attention_multiplier": 1.0,
    "num_local_experts": 8, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.001,
}

FAMILY = decoder_family(
    name="Granite MoE",
    model_type="granitemoe",
    architecture="GraniteMoeForCausalLM",
    defaults=DEFAULTS,
    parts=[*GRANITE_PARTS, GraniteExperts(shared="none")],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="as granite, with num_local_experts (top-k logits softmaxed) and intermediate_size -> moe in every layer",
    caveats="experts in every layer, no biases on them; reads fused or checkpoint-named expert tensors, writes them as "
            "save_pretrained does",
)
