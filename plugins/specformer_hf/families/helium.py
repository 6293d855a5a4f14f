"""Helium (``model_type: helium``, Kyutai's helium-1-preview-2b): Llama's pre-norm blocks with an interleaved rope
(adjacent channel pairs), attention_bias on q, k and v only, mlp_bias, and an o_proj of hidden_size -> hidden_size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import FamilyView, Fixed, Part, Switch
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.positions import Rope
from specformer_hf.specview import NotExpressible

#: transformers' HeliumConfig defaults (helium-1-preview-2b's sizes; its default_theta is 100000).
DEFAULTS = {
    "vocab_size": 48000, "hidden_size": 2560, "intermediate_size": 7040, "num_hidden_layers": 24,
    "num_attention_heads": 20, "num_key_value_heads": 20, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-8, "tie_word_embeddings": False, "attention_bias": False,
    "mlp_bias": False, "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0},
}


@dataclass(frozen=True)
class HeadsFillHidden(Part):
    """num_attention_heads * head_dim must be hidden_size: HeliumAttention's o_proj is hidden_size -> hidden_size
    whatever head_dim says, so transformers cannot load another shape."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        attention = model["block"]["mixer"]
        if attention["n_heads"] * attention["head_dim"] != model["d_model"]:
            raise UserError(f"{cfg.family}: num_attention_heads ({attention['n_heads']}) x head_dim "
                            f"({attention['head_dim']}) must equal hidden_size ({model['d_model']}): transformers' "
                            "Helium projects hidden_size back to hidden_size in o_proj")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        n_heads, _, head_dim = view.view.attention_sizes()
        if n_heads * head_dim != view.model.d_model:
            raise NotExpressible("model.block.mixer.head_dim", f"Hugging Face {view.name} needs n_heads x head_dim "
                                 f"= d_model ({n_heads} x {head_dim} != {view.model.d_model})")


FAMILY = decoder_family(
    name="Helium",
    model_type="helium",
    architecture="HeliumForCausalLM",
    defaults=DEFAULTS,
    parts=[
        # Helium's apply_rotary_pos_emb pairs adjacent channels (repeat_interleave), over whole heads.
        *replace_part(LLAMA_PARTS, Rope(interleaved=True)),
        Switch("attention_bias", ("mixer.qkv_bias",)),
        Fixed("mixer.out_bias", False, why="has no bias on o_proj (attention_bias is on q, k and v only)"),
        Switch("mlp_bias", ("ffn.bias",)),
        HeadsFillHidden(),
    ],
    maps="prenorm RMSNorm, rope interleaved (adjacent pairs) over whole heads (default theta 100000), GQA, head_dim, "
         "attention_bias on q/k/v, mlp_bias, SwiGLU",
    caveats="o_proj never has a bias; num_attention_heads x head_dim must equal hidden_size (transformers' o_proj "
            "is hidden_size -> hidden_size)",
)
