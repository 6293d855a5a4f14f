"""Hunyuan-V1 dense (``model_type: hunyuan_v1_dense``, Hunyuan-0.5B to 7B): Llama's blocks with an RMSNorm per query
and key head applied after RoPE, and a rope base stretched by NTK ``alpha``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader, rope_parameters
from specformer_hf.parts.attention import QKNorm, attention_sizes
from specformer_hf.parts.base import Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.positions import Rope

#: transformers' HunYuanDenseV1Config defaults.
DEFAULTS = {
    "vocab_size": 290943, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": None, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "attention_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class AlphaRope(Rope):
    """Rope, where ``rope_type: dynamic`` with an ``alpha`` is Hunyuan's fixed NTK stretch of the base:
    theta * alpha ** (head_dim / (head_dim - 2)), the same at every length (transformers' ``ntk_alpha``), read as a
    plain rope of that theta."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        params = rope_parameters(cfg)
        if params.get("rope_type") == "dynamic" and params.get("alpha"):
            head_dim = attention_sizes(cfg)["head_dim"]
            theta = float(params["rope_theta"]) * float(params["alpha"]) ** (head_dim / (head_dim - 2))
            cfg.data.update(rope_parameters={"rope_type": "default", "rope_theta": theta}, rope_scaling=None)
        super().read(cfg, model)


#: Hunyuan-V1's query and key norms: RMSNorm per head (eps rms_norm_eps), after the rotation.
HUNYUAN_QK_NORM = QKNorm("head", order="after_rope", names=("query_layernorm", "key_layernorm"))

FAMILY = decoder_family(
    name="Hunyuan-V1 (dense)",
    model_type="hunyuan_v1_dense",
    architecture="HunYuanDenseV1ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *replace_part(LLAMA_PARTS, AlphaRope(), instead_of=Rope),
        HUNYUAN_QK_NORM,
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
    ],
    non_math_fields=("eod_token_id",),
    maps="as Llama (prenorm RMSNorm, rope, GQA, head_dim, SwiGLU without biases, attention_bias) with "
         "query_layernorm / key_layernorm as qk_norm (RMSNorm per head, eps rms_norm_eps) after RoPE "
         "(qk_norm_order: after_rope); rope_type dynamic with alpha as a rope of theta * alpha^(head_dim / (head_dim - 2))",
    caveats="attention_bias applies to q, k, v and o alike; an alpha-stretched rope is exported as a default rope of the "
            "stretched theta (the same frequencies)",
)
