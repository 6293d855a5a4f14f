"""MiniCPM3 (``model_type: minicpm3``, MiniCPM3-4B): DeepSeek-V2's latent attention with a rope that turns halves,
a SwiGLU in every layer, and muP-style scales on the embeddings, the residual branches and the logits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import LatentAttention
from specformer_hf.parts.base import FamilyView, Part, exact_preimage
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes, embedding_multiplier_config
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Rule
from specformer_hf.specview import NotExpressible

#: transformers' MiniCPM3Config defaults (MiniCPM3-4B's sizes; the rest LlamaConfig's).
DEFAULTS = {
    "vocab_size": 73448, "hidden_size": 2560, "intermediate_size": 6400, "num_hidden_layers": 62,
    "num_attention_heads": 40, "num_key_value_heads": 40, "hidden_act": "silu", "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
    "kv_lora_rank": 256, "q_lora_rank": 768, "qk_nope_head_dim": 64, "qk_rope_head_dim": 32, "v_head_dim": None,
    "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class ValueHeads(Part):
    """v_head_dim null: hidden_size / num_attention_heads, as MiniCPM3Config fills it in (read before the attention)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get("v_head_dim") is None:
            cfg.data["v_head_dim"] = cfg.get_size("hidden_size") // cfg.get_size("num_attention_heads")


@dataclass(frozen=True)
class MupScales(Part):
    """scale_emb <-> embedding_multiplier; scale_depth <-> the pre-norm layout's residual_multiplier
    ``scale_depth / sqrt(num_hidden_layers)``; dim_model_base <-> ``logit_scale = 1 / (hidden_size / dim_model_base)``
    (MiniCPM3 divides the final hidden state by hidden_size / dim_model_base; the head is linear, so scaling the
    logits is the same). A null scale_depth or dim_model_base is no scaling, as MiniCPM3Config makes it."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        hidden, n_layers = cfg.get_size("hidden_size"), cfg.get_layers("num_hidden_layers")
        model["embedding_multiplier"] = cfg.get_float("scale_emb")
        depth = cfg.get("scale_depth")
        depth = math.sqrt(n_layers) if depth is None else cfg.get_float("scale_depth")
        model.setdefault("block", {})["layout"] = {"kind": "prenorm", "residual_multiplier": depth / math.sqrt(n_layers)}
        base = cfg.get("dim_model_base")
        base = hidden if base is None else cfg.get_int("dim_model_base")
        if base < 1:
            raise UserError(f"{cfg.family}: dim_model_base divides hidden_size to scale the logits and must be a "
                            f"positive integer, got {base!r}")
        model["logit_scale"] = 1.0 / (hidden / base)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("layout", ("prenorm",))
        hidden, n_layers = view.model.d_model, view.model.n_layers
        residual = view.uniform("layout", "residual_multiplier")
        config["scale_emb"] = embedding_multiplier_config(view.model)
        config["scale_depth"] = exact_preimage(residual, lambda v: v / math.sqrt(n_layers), residual * math.sqrt(n_layers))
        scale = view.model.logit_scale
        base = round(scale * hidden)
        if base < 1 or not math.isclose(1.0 / (hidden / base), scale, rel_tol=1e-12):
            raise NotExpressible("model.logit_scale", f"{scale!r}: Hugging Face {view.name} scales the logits by "
                                 f"dim_model_base / d_model with a whole dim_model_base (d_model {hidden})")
        config["dim_model_base"] = base

    def rules(self) -> list[Rule]:
        return Layout("prenorm").rules()


FAMILY = decoder_family(
    name="MiniCPM3",
    model_type="minicpm3",
    architecture="MiniCPM3ForCausalLM",
    defaults=DEFAULTS,
    parts=[Sizes(), Rope(), MupScales(), RMSNorm(), ValueHeads(), LatentAttention(), GatedFFN(bias_key="mlp_bias")],
    maps="attention mla (q_lora_rank or none, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim (null: "
         "hidden / heads), attention_bias; YaRN mscale_all_dim on the scores) with a rope that turns halves; SwiGLU "
         "(mlp_bias); scale_emb -> embedding_multiplier; scale_depth -> prenorm residual_multiplier = scale_depth / "
         "sqrt(num_hidden_layers); dim_model_base -> logit_scale = dim_model_base / hidden_size",
    caveats="the logits are scaled after the head rather than the hidden state before it (the same up to rounding); "
            "export needs d_model * logit_scale to be a whole dim_model_base",
)
