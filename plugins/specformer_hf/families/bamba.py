"""Bamba (``model_type: bamba``, IBM's Bamba-9B): Mamba-2 layers with grouped-query attention at
``attn_layer_indices``, each followed by a SwiGLU, in pre-norm blocks.

The Mamba-2 mixer is Granite 4.0-H's (the ``mamba_*`` fields, a gated RMSNorm over
``mamba_n_groups`` groups, ``time_step_limit``); the attention is Llama's with biases on q, k, v
and o by ``attention_bias``, rotating only the first half of each head: BambaConfig writes
``partial_rotary_factor`` 0.5 into the rope parameters when they name none. Checkpoints name the
norms ``input_layernorm``, ``pre_ff_layernorm`` and ``final_layernorm``, the feed-forward
``feed_forward``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families.granitemoehybrid import hybrid_layers, mamba_config
from specformer_hf.parts.attention import Attention, attention_sizes
from specformer_hf.parts.base import BLOCK_MIXER, LAYER, FamilyView, Part, keeps_keys, keeps_state, uniform_mixers
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.mamba2 import HYBRID_FIELDS, mamba2_rules
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import AtLayers, Copy, Rule, renamed
from specformer_hf.specview import NotExpressible

#: transformers' BambaConfig defaults (Bamba-9B's sizes; rope_parameters as __post_init__ completes them).
DEFAULTS = {
    "vocab_size": 128000, "tie_word_embeddings": False, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "rms_norm_eps": 1e-5, "max_position_embeddings": 262144, "attn_layer_indices": None, "mamba_n_heads": 128,
    "mamba_d_head": "auto", "mamba_n_groups": 1, "mamba_d_state": 256, "mamba_d_conv": 4, "mamba_expand": 2,
    "mamba_chunk_size": 256, "mamba_conv_bias": True, "mamba_proj_bias": False, "time_step_limit": (0.0, float("inf")),
    "attention_bias": False, "mlp_bias": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}

MAMBA_FIELDS = ("mamba_n_heads", "mamba_n_groups", "mamba_d_state", "mamba_d_head", "mamba_d_conv", "mamba_expand",
                "mamba_chunk_size", "mamba_conv_bias", "mamba_proj_bias", "time_step_limit")


@dataclass(frozen=True)
class BambaMixers(Part):
    """attn_layer_indices, the attention's sizes and attention_bias, the mamba_* fields <-> per-layer mixers."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        indices = cfg.get("attn_layer_indices") or []
        if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n_layers
                                                    for i in indices):
            raise UserError(f"{cfg.family}: attn_layer_indices must list layer indices below {n_layers}, got {indices!r}")
        kinds = ["attention" if i in indices else "mamba2" for i in range(n_layers)]
        bias = bool(cfg.get("attention_bias"))
        mixers = {"attention": {**attention_sizes(cfg), "qkv_bias": bias, "out_bias": bias}}
        if "mamba2" in kinds:
            mixers["mamba2"] = HYBRID_FIELDS.spec(cfg, d_inner=cfg.get_size("mamba_expand") * cfg.get_size("hidden_size"))
        else:
            cfg.mark_read(*MAMBA_FIELDS)  # no Mamba layer: the fields are inert
        hybrid_layers(model, kinds, mixers)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        kinds = view.per_layer("mixer", "kind")
        for i, kind in enumerate(kinds):
            if kind not in ("attention", "mamba2"):
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{kind!r} has no equivalent in Hugging Face "
                                     f"{view.name} (whose layers are 'mamba2' or 'attention')")
        config["attn_layer_indices"] = [i for i, kind in enumerate(kinds) if kind == "attention"]
        layers = view.view.layers
        attention = [layer["mixer"] for layer in layers if layer["mixer"]["kind"] == "attention"]
        if attention:
            a = uniform_mixers(attention, family=view.name, what="attention")
            n_heads, n_kv, head_dim = view.view.attention_sizes(kinds.index("attention"))
            if n_heads * head_dim != view.model.d_model:
                raise NotExpressible("model.block.mixer.head_dim", f"Hugging Face {view.name} has head_dim = "
                                     f"d_model / n_heads ({view.model.d_model} / {n_heads})")
            if a["qkv_bias"] != a["out_bias"] or a.get("scale") is not None:
                raise NotExpressible("model.block.mixer", f"Hugging Face {view.name}'s attention has biases on q, k, v "
                                     "and o together or none (qkv_bias = out_bias), and the usual 1/sqrt(head_dim) scale")
            config.update(num_attention_heads=n_heads, num_key_value_heads=n_kv, attention_bias=a["qkv_bias"])
        config.update(mamba_config(view, layers, gates_first=True))

    def rules(self) -> list[Rule]:
        attention = [AtLayers(rule, where=lambda site: keeps_keys(site.mixer), layers="attention")
                     for rule in Attention().rules()]
        mamba = [AtLayers(rule, where=lambda site: keeps_state(site.mixer), layers="Mamba-2")
                 for rule in mamba2_rules(f"{LAYER}.mamba", BLOCK_MIXER)]
        return attention + mamba


@dataclass(frozen=True)
class FeedForward(GatedFFN):
    """Llama's SwiGLU (mlp_bias) under ``feed_forward.``."""

    def rules(self) -> list[Rule]:
        return [renamed(rule, lambda name: name.replace(".mlp.", ".feed_forward.")) for rule in super().rules()]


@dataclass(frozen=True)
class BambaSizes(Sizes):
    """Sizes, the final norm saved as ``model.final_layernorm``."""

    def rules(self) -> list[Rule]:
        return [Copy("model.embed_tokens.weight", "embedding.weight"),
                Copy("model.final_layernorm.weight", "final_norm.weight"), Copy("lm_head.weight", "lm_head.weight")]


FAMILY = decoder_family(
    name="Bamba",
    model_type="bamba",
    architecture="BambaForCausalLM",
    defaults=DEFAULTS,
    parts=[
        BambaSizes(),
        Rope(partial=True, write_fraction=True),
        Layout("prenorm", names=(("attention_norm", "input_layernorm"), ("ffn_norm", "pre_ff_layernorm"))),
        RMSNorm(),
        BambaMixers(),
        FeedForward(bias_key="mlp_bias"),
    ],
    # Training only (the z-loss) and how many logits generation computes.
    non_math_fields=("z_loss_coefficient", "num_logits_to_keep"),
    maps="attn_layer_indices -> attention (GQA, attention_bias on q, k, v and o) at those layers, mamba2 elsewhere "
         "(layers: overrides; the mamba_* fields and time_step_limit, its gated RMSNorm over mamba_n_groups groups at "
         "rms_norm_eps); rope on partial_rotary_factor of each head (0.5 when rope_parameters name none, as "
         "BambaConfig fills in); prenorm RMSNorm (input_layernorm, pre_ff_layernorm, final_layernorm); SwiGLU "
         "feed_forward of intermediate_size (mlp_bias)",
    caveats="one attention and one Mamba-2 setting for all layers; head_dim is hidden_size / num_attention_heads",
)
