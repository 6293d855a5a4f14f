"""OLMo Hybrid (``model_type: olmo_hybrid``, Olmo-Hybrid-7B): prenorm Gated DeltaNet layers (beta up to 2) and, every
fourth layer, OLMo-2's attention layer (norms after each sublayer, q/k RMSNorm over all heads), rope or none."""

from __future__ import annotations

from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.deltanet import (AttentionFields, DeltaNetFields, HybridMixers, olmo_attention_rules,
                                          olmo_default_types, olmo_delta_rules, olmo_norm_rules)
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import RMSNorm
from specformer_hf.parts.positions import OptionalRope

#: transformers' OlmoHybridConfig defaults (the linear_* head sizes None: derived from the attention's).
DEFAULTS = {
    "vocab_size": 100352, "hidden_size": 3840, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 30, "num_key_value_heads": None, "hidden_act": "silu", "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False, "layer_types": None,
    "linear_num_key_heads": None, "linear_num_value_heads": None, "linear_key_head_dim": None,
    "linear_value_head_dim": None, "linear_a_log_min": 0.0, "linear_a_log_max": 16.0, "linear_dt_min": 0.001,
    "linear_dt_max": 0.1, "linear_dt_init_floor": 1e-4, "linear_conv_kernel_dim": 4, "linear_allow_neg_eigval": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}

FAMILY = decoder_family(
    name="OLMo Hybrid",
    model_type="olmo_hybrid",
    architecture="OlmoHybridForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(), OptionalRope(), RMSNorm(), GatedFFN(),
        HybridMixers(DeltaNetFields(olmo=True), AttentionFields(gated=False), olmo_default_types,
                     layouts=("prenorm", "postnorm_inside"), both_types=True),
    ],
    extra_rules=[*olmo_norm_rules(), *olmo_delta_rules(), *olmo_attention_rules()],
    ignore_tensors=(r"mtp\..*",),
    maps="layer_types (default: every 4th layer attention) -> gated_deltanet (prenorm) in the block and attention "
         "(postnorm_inside, q/k RMSNorm over all heads) in a layers: override; linear_* sizes, linear_conv_kernel_dim, "
         "linear_allow_neg_eigval -> negative_eigenvalues, the A/dt initialisation ranges; rope_theta null -> "
         "positional none",
    caveats="mtp.* is skipped, as transformers skips it; the gated norm's eps is always 1e-5 "
            "(flash-linear-attention's default); q/k/v convolutions are written at their real widths (transformers' "
            "own save splits the fused one in three equal parts); needs at least one layer of each type",
)
