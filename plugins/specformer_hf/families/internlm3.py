"""InternLM3 (``model_type: internlm3``, InternLM3-8B): transformers runs it as Llama, with config.json's qkv_bias and
bias as attention_bias and mlp_bias, which must agree."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families import llama
from specformer_hf.parts.base import FamilyView, Part, SavedNames, set_path
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family

#: transformers' InternLM3Config defaults (InternLM3-8B's sizes): LlamaConfig's, with these changed.
DEFAULTS = {
    **llama.DEFAULTS, "vocab_size": 128512, "intermediate_size": 10240, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "head_dim": 128,
}

#: InternLM3Config's attribute_map: the published config.json uses the first names.
SAVED_NAMES = (("qkv_bias", "attention_bias"), ("bias", "mlp_bias"))

BIASES = ("mixer.qkv_bias", "mixer.out_bias", "ffn.bias")


@dataclass(frozen=True)
class OneBias(Part):
    """attention_bias and mlp_bias, equal <-> biases on q, k, v, o and the MLP, or on none.

    transformers' InternLM3 refuses a config where they differ (its Llama attention would put
    qkv_bias on o_proj too, which InternLM3 does not have), so import and export do too.
    """

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        attention, mlp = bool(cfg.get("attention_bias")), bool(cfg.get("mlp_bias"))
        if attention != mlp:
            raise UserError(f"{cfg.family}: attention_bias (qkv_bias) {attention} and mlp_bias (bias) {mlp} differ, "
                            "which transformers' InternLM3 does not run; they must be equal")
        for path in BIASES:
            set_path(model, path, attention)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        biased = view.get(BIASES[0])
        config.update(attention_bias=biased, mlp_bias=biased)  # the read-back check refuses specs whose biases differ


FAMILY = decoder_family(
    name="InternLM3",
    model_type="internlm3",
    architecture="LlamaForCausalLM",
    defaults=DEFAULTS,
    parts=[SavedNames(SAVED_NAMES), *LLAMA_PARTS, OneBias()],
    ignore_tensors=(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq",),
    maps="as Llama (transformers builds LlamaForCausalLM), head_dim (default 128); qkv_bias / attention_bias and "
         "bias / mlp_bias -> biases on q, k, v, o and the MLP",
    caveats="the two bias switches must agree (transformers refuses InternLM3 configs where they differ)",
)
