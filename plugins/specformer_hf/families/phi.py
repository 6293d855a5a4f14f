"""Phi (``model_type: phi``, Phi-1, Phi-1.5, Phi-2): parallel attention and MLP on one LayerNorm, partial rotary,
biases everywhere, an LM head with a bias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, FamilyView, Fixed, Part
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import model_sizes, model_sizes_config
from specformer_hf.parts.feedforward import PlainMLP
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, Fused, Rule, qkv_sizes
from specformer_hf.specview import NotExpressible

#: Phi's fc1/fc2 MLP, biased whatever the config says.
PHI_MLP = PlainMLP(fc_in="fc1", fc_out="fc2", always_biased=True)

#: transformers' PhiConfig defaults (Phi-1's sizes); its __post_init__ makes partial_rotary_factor 0.5.
DEFAULTS = {
    "vocab_size": 51200, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 24,
    "num_attention_heads": 32, "num_key_value_heads": None, "hidden_act": "gelu_new", "max_position_embeddings": 2048,
    "layer_norm_eps": 1e-5, "tie_word_embeddings": False, "qk_layernorm": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}


@dataclass(frozen=True)
class BiasedHead(Part):
    """Sizes, and the LM head's bias that PhiForCausalLM always has (a tied head with it is not mapped yet)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.require("tie_word_embeddings", (False,),
                    why="Phi's LM head has a bias of its own, beside a tied weight not mapped by this family yet")
        model.update(model_sizes(cfg), lm_head_bias=True)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if not view.model.lm_head_bias:
            raise NotExpressible("model.lm_head_bias", f"Hugging Face {view.name}'s LM head always has a bias")
        config.update(model_sizes_config(view.view))

    def rules(self) -> list[Rule]:
        return [Copy("model.embed_tokens.weight", "embedding.weight"),
                Copy("model.final_layernorm.weight", "final_norm.weight"),
                Copy("model.final_layernorm.bias", "final_norm.bias"),
                Copy("lm_head.weight", "lm_head.weight"), Copy("lm_head.bias", "lm_head.bias")]


@dataclass(frozen=True)
class QKLayerNorm(Part):
    """qk_layernorm <-> qk_norm LayerNorm with a bias (eps layer_norm_eps), one for all heads (``qk_norm_scope: head``)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.require("qk_layernorm", (False, True), why="it switches the q/k LayerNorms on or off"):
            model.setdefault("block", {}).setdefault("mixer", {}).update(
                qk_norm={"kind": "layernorm", "eps": cfg.get_float("layer_norm_eps")}, qk_norm_scope="head")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        norm = view.uniform("mixer", "qk_norm")
        if norm is not None and view.uniform("mixer", "qk_norm_scope") != "head":
            raise NotExpressible("model.block.mixer.qk_norm_scope",
                                 f"Hugging Face {view.name}'s qk_layernorm is one norm shared by every head "
                                 "(qk_norm_scope: head)")
        config["qk_layernorm"] = norm is not None  # the read-back comparison checks its kind, bias and eps

    def rules(self) -> list[Rule]:
        return [Copy(f"{ATTN}.{hf}.{p}", f"{BLOCK_MIXER}.{ours}.{p}")
                for hf, ours in (("q_layernorm", "q_norm"), ("k_layernorm", "k_norm")) for p in ("weight", "bias")]


FAMILY = decoder_family(
    name="Phi",
    model_type="phi",
    architecture="PhiForCausalLM",
    defaults=DEFAULTS,
    parts=[
        BiasedHead(),
        Rope(partial=True, write_fraction=True),
        Layout("parallel", norm_bias=True),
        LayerNorm(),
        Attention(head_dim=False),
        Fixed("mixer.qkv_bias", True, why="always has q/k/v biases"),
        Fixed("mixer.out_bias", True, why="always has a bias on the output projection (dense)"),
        QKLayerNorm(),
        PHI_MLP,
    ],
    # Phi names the output projection dense and the final norm final_layernorm: its own rules, not the parts'.
    rules=[
        *BiasedHead().rules(),
        *Layout("parallel", norm_bias=True).rules(),
        Fused([f"{ATTN}.q_proj.weight", f"{ATTN}.k_proj.weight", f"{ATTN}.v_proj.weight"],
              f"{BLOCK_MIXER}.qkv.weight", sizes=qkv_sizes),
        Fused([f"{ATTN}.q_proj.bias", f"{ATTN}.k_proj.bias", f"{ATTN}.v_proj.bias"],
              f"{BLOCK_MIXER}.qkv.bias", sizes=qkv_sizes),
        Copy(f"{ATTN}.dense.weight", f"{BLOCK_MIXER}.out.weight"),
        Copy(f"{ATTN}.dense.bias", f"{BLOCK_MIXER}.out.bias"),
        *QKLayerNorm().rules(),
        *PHI_MLP.rules(),
    ],
    maps="layout parallel with one shared LayerNorm (input_layernorm), rope with partial_rotary_factor (default 0.5), "
         "GQA, q/k/v and dense biases, qk_layernorm -> qk_norm LayerNorm shared by the heads, GELU MLP (fc1, fc2) "
         "with biases, final_layernorm, LM head with a bias",
    caveats="head_dim is always hidden / heads; the head cannot be tied (it has its own bias)",
)
