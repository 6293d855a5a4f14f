"""Persimmon (``model_type: persimmon``, adept/persimmon-8b; Fuyu's decoder): pre-norm LayerNorm blocks, rope on part
of each head, a fused per-head query_key_value, per-head q/k LayerNorms, a squared-ReLU MLP, biases everywhere."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.families.phi import QKLayerNorm
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, FamilyView, Fixed, Part
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import PlainMLP
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Copy, HeadInterleavedQKV
from specformer_hf.specview import NotExpressible

#: transformers' PersimmonConfig defaults (Persimmon-8B's sizes); its __post_init__ makes partial_rotary_factor 0.5.
DEFAULTS = {
    "vocab_size": 262144, "hidden_size": 4096, "intermediate_size": 16384, "num_hidden_layers": 36,
    "num_attention_heads": 64, "hidden_act": "relu2", "max_position_embeddings": 16384, "layer_norm_eps": 1e-5,
    "tie_word_embeddings": False, "qk_layernorm": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}

#: Persimmon's dense_h_to_4h / dense_4h_to_h MLP, biased whatever the config says.
MLP = PlainMLP(fc_in="dense_h_to_4h", fc_out="dense_4h_to_h", always_biased=True)


@dataclass(frozen=True)
class MultiHead(Part):
    """PersimmonAttention has one key/value head per query head, each hidden_size / num_attention_heads wide."""

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        n_heads, n_kv, _ = view.attention_sizes()
        if n_kv != n_heads:
            raise NotExpressible("model.block.mixer.n_kv_heads", f"{n_kv}: Hugging Face {view.name} has one key/value "
                                 f"head per query head ({n_heads})")
        config.pop("num_key_value_heads", None)


FAMILY = decoder_family(
    name="Persimmon",
    model_type="persimmon",
    architecture="PersimmonForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        Rope(partial=True, write_fraction=True),
        Layout("prenorm", norm_bias=True),
        LayerNorm(),
        Attention(head_dim=False),
        MultiHead(),
        Fixed("mixer.qkv_bias", True, why="always has q/k/v biases"),
        Fixed("mixer.out_bias", True, why="always has a bias on the output projection (dense)"),
        QKLayerNorm(),
        MLP,
    ],
    # Persimmon's own tensor names (final_layernorm, a per-head query_key_value, dense): its rules, not the parts'.
    rules=[
        Copy("model.embed_tokens.weight", "embedding.weight"),
        Copy("model.final_layernorm.weight", "final_norm.weight"),
        Copy("model.final_layernorm.bias", "final_norm.bias"),
        Copy("lm_head.weight", "lm_head.weight"),
        *Layout("prenorm", norm_bias=True).rules(),
        # query_key_value's rows are per head [q_h; k_h; v_h] (GPT-NeoX's layout).
        HeadInterleavedQKV(f"{ATTN}.query_key_value.weight", f"{BLOCK_MIXER}.qkv.weight"),
        HeadInterleavedQKV(f"{ATTN}.query_key_value.bias", f"{BLOCK_MIXER}.qkv.bias"),
        Copy(f"{ATTN}.dense.weight", f"{BLOCK_MIXER}.out.weight"),
        Copy(f"{ATTN}.dense.bias", f"{BLOCK_MIXER}.out.bias"),
        *QKLayerNorm().rules(),
        *MLP.rules(),
    ],
    non_math_fields=("hidden_dropout",),
    maps="pre-norm LayerNorm (layer_norm_eps; final_layernorm), rope with partial_rotary_factor (default 0.5), "
         "query_key_value regrouped from per-head [q_h k_h v_h] to [q; k; v], q/k/v and dense biases, qk_layernorm -> "
         "qk_norm LayerNorm shared by the heads, relu2 MLP (dense_h_to_4h, dense_4h_to_h) with biases",
    caveats="multi-head attention only; head_dim is always hidden / heads",
)

__all__ = ["FAMILY"]
