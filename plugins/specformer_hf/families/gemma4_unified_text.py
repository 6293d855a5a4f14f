"""Gemma 4 unified text (``model_type: gemma4_unified_text``, ``Gemma4UnifiedForCausalLM``): the language model of the
encoder-free multimodal Gemma 4 (``gemma4_unified``), Gemma 4's attention and MLP in Gemma 2's sandwich layer.

Its decoder layer is not Gemma 4 text's: it has no per-layer input embeddings and no mixture of experts (its config
class drops those fields), so a layer is attention and a GeGLU, each between its pre and post RMSNorm, then the whole
hidden state times the layer's ``layer_scalar``. Everything else (per-layer heads, keys as values on the global
layers, the last layers reading earlier layers' keys and values, the per-layer-type ropes, the value norm, score
scale 1, sqrt(d) embeddings, the soft-capped head) is Gemma 4's, read by its parts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families import gemma4
from specformer_hf.parts.base import FamilyView, Part
from specformer_hf.parts.decoder import decoder_family, language_model_of
from specformer_hf.specview import NotExpressible

#: The Gemma 4 text fields Gemma4UnifiedTextConfig drops, at the values that leave their mechanism out.
DROPPED = {"hidden_size_per_layer_input": 0, "vocab_size_per_layer_input": None, "enable_moe_block": False,
           "num_experts": None, "top_k_experts": None, "moe_intermediate_size": None}

#: transformers' Gemma4UnifiedTextConfig defaults: Gemma4TextConfig's, less the dropped fields, with these changed.
DEFAULTS = {
    **{k: v for k, v in gemma4.DEFAULTS.items() if k not in DROPPED},
    "sliding_window": 1024, "max_position_embeddings": 262_144, "use_bidirectional_attention": "vision",
}


@dataclass(frozen=True)
class NoPerLayerInputsOrExperts(Part):
    """Gemma 4's per-layer inputs and mixture of experts, which the unified text model lacks: off on import (a
    config.json that turns one on is refused), refused in a spec on export, their fields left out of config.json."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        for key, off in DROPPED.items():
            value = cfg.get(key, None)
            # The per-layer vocabulary does nothing without their width; the rest turn a mechanism on.
            if key != "vocab_size_per_layer_input" and value not in (None, 0, False):
                raise UserError(f"{cfg.family}: config field {key!r} = {value!r} is not supported: Gemma 4 unified's "
                                "text model has no per-layer inputs and no mixture of experts (transformers' "
                                "Gemma4UnifiedTextConfig has no such field)")
            cfg.data[key] = off
        cfg.data["vocab_size_per_layer_input"] = 0  # Gemma 4's parts read an integer, and make nothing of it at width 0

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        if config.get("hidden_size_per_layer_input"):
            raise NotExpressible("model.per_layer_input", f"Hugging Face {view.name} has no per-layer inputs")
        if config.get("enable_moe_block"):
            raise NotExpressible("model.block.ffn.kind", f"Hugging Face {view.name} has no mixture of experts "
                                                          "(a geglu in every layer)")
        for key in DROPPED:
            config.pop(key, None)


FAMILY = decoder_family(
    name="Gemma 4 unified",
    model_type="gemma4_unified_text",
    architecture="Gemma4UnifiedForCausalLM",
    defaults=DEFAULTS,
    # First on import (it sets the dropped fields for Gemma 4's parts), last on export (it takes them out again).
    parts=[NoPerLayerInputsOrExperts(), *gemma4.FAMILY_PARTS, NoPerLayerInputsOrExperts()],
    ignore_tensors=gemma4.IGNORED_TENSORS,
    maps="as Gemma 4 text (sandwich norms with layer_scalar, sqrt(d) embeddings, per-layer windows, heads and ropes "
         "by layer_types and per_layer_config, attention_k_eq_v, num_kv_shared_layers -> kv_from, the value norm, "
         "use_double_wide_mlp, final_logit_softcapping) without per-layer inputs or experts: a geglu in every layer",
    caveats="text only (Gemma4UnifiedForCausalLM); use_bidirectional_attention 'all' is refused ('vision', the "
            "default, changes only image tokens); per-layer inputs and enable_moe_block, which the config class "
            "lacks, are refused",
)

#: The published checkpoints: the multimodal model's config.json and weights, read for its language model.
MULTIMODAL = language_model_of(FAMILY, name="Gemma 4 unified (multimodal)", model_type="gemma4_unified",
                               architecture="Gemma4UnifiedForConditionalGeneration",
                               skipped=(r"model\.vision_embedder\..*", r"model\.embed_vision\..*",
                                        r"model\.embed_audio\..*"),
                               skipped_what="the image and audio embedders (model.vision_embedder.*, "
                                            "model.embed_vision.*, model.embed_audio.*) are")
