"""Emu3 (``model_type: emu3``, BAAI's Emu3-Chat / Emu3-Gen): a Llama decoder over a vocabulary of text and
VQ image tokens; the VQ-VAE that turns images into those tokens is no part of the language model.

Two layouts hold the text model. The published checkpoints (``Emu3ForConditionalGeneration``) nest its
fields under ``text_config`` and keep the weights as ``text_model.model.*`` and ``text_model.lm_head.weight``
beside ``vqmodel.*`` (transformers renames them to ``model.text_model.*`` and ``lm_head.weight`` when it loads
them; either spelling is read). ``Emu3ForCausalLM`` alone saves its flat ``Emu3TextConfig``
(``model_type: emu3_text_model``) with Llama's ``model.*`` names. transformers' auto classes load only the nested
config as a causal LM (``AutoModelForCausalLM`` does not know ``emu3_text_model``), and ``Emu3ForCausalLM`` then
takes ``text_config`` and reads ``model.*`` names: so export writes that, whichever layout was imported.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.parts.base import Switch, set_path
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family
from specformer_hf.specview import ExportsAs, SpecView

#: transformers' Emu3TextConfig defaults (Emu3-Chat's language model: 32 layers of 4096, 8 key/value heads).
DEFAULTS = {
    "vocab_size": 184622, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "hidden_act": "silu",
    "max_position_embeddings": 9216, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
}


@dataclass(frozen=True)
class ClassAttributeSwitch(Switch):
    """attention_bias and mlp_bias: class attributes of Emu3TextConfig (False), not fields, which its modules read
    all the same; a config.json may set them. (head_dim likewise: absent, hidden / heads.)"""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        value = bool(cfg.get(self.key, False))
        for path in self.paths:
            set_path(model, path, value)

TEXT_MODEL_TYPE = "emu3_text_model"

#: The tensors of the VQ-VAE image tokenizer, as saved (vqmodel.*) and as transformers names them (model.vqmodel.*).
VQ_TENSORS = (r"vqmodel\..*", r"model\.vqmodel\..*")

_TEXT = decoder_family(
    name="Emu3 text",
    model_type=TEXT_MODEL_TYPE,
    architecture="Emu3ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        *LLAMA_PARTS,
        ClassAttributeSwitch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        ClassAttributeSwitch("mlp_bias", ("ffn.bias",)),
    ],
    maps="as Llama (prenorm RMSNorm, rope theta, GQA, head_dim, attention_bias, mlp_bias, SwiGLU, tied or untied "
         "head), with Emu3's defaults (rope_theta 1e6)",
    caveats="the flat config Emu3ForCausalLM saves; export writes the nested emu3 config, which AutoModelForCausalLM "
            "loads",
)


def _text_exports_as(view: SpecView) -> dict[str, Any]:
    raise ExportsAs("", "export writes the nested emu3 config (transformers' auto classes do not load "
                        f"{TEXT_MODEL_TYPE} as a causal LM)", target="emu3")


#: What Emu3ForCausalLM saves: read only; export goes through :data:`FAMILY`.
TEXT = dataclasses.replace(_TEXT, to_config=_text_exports_as)


def _to_spec(cfg: ConfigReader) -> dict[str, Any]:
    inner = cfg.get("text_config", None)
    if not isinstance(inner, dict):
        raise UserError(f"{cfg.family}: config.json needs a 'text_config' mapping (the language model's fields), "
                        f"got {inner!r}")
    reader = ConfigReader(inner, defaults=DEFAULTS, family=f"{cfg.family} text_config", max_layers=cfg.max_layers)
    model = _TEXT.to_spec(reader)
    # Emu3ForCausalLM ties by its own (text) config; the multimodal model by the top level: both must agree.
    if cfg.has("tie_word_embeddings") and bool(cfg.get("tie_word_embeddings")) != model["tie_embeddings"]:
        raise UserError(f"{cfg.family}: tie_word_embeddings is {cfg.get('tie_word_embeddings')!r} at the top level but "
                        f"{reader.get('tie_word_embeddings')!r} in text_config; transformers ties the causal LM by "
                        "text_config and the multimodal model by the top level, so the two must agree")
    cfg.mark_read(*cfg.data)  # vq_config, vocabulary_map, image_token_id: the image tokenizer's, not the text model's
    cfg.unused.extend(f"text_config.{key}" for key in reader.unread(also_harmless=_TEXT.non_math_fields))
    return model


def _to_config(view: SpecView) -> dict[str, Any]:
    text = _TEXT.to_config(view)
    return {"text_config": {**text, "model_type": TEXT_MODEL_TYPE},
            "tie_word_embeddings": text.get("tie_word_embeddings", DEFAULTS["tie_word_embeddings"])}


FAMILY = Family(
    name="Emu3",
    model_type="emu3",
    architecture="Emu3ForCausalLM",
    defaults={},
    to_spec=_to_spec,
    to_config=_to_config,
    weights=_TEXT.weights,
    ignore_tensors=VQ_TENSORS,
    # The published layout first, then the one transformers renames it to in memory.
    aliases=(("model.", "text_model.model."), ("lm_head.", "text_model.lm_head."), ("model.", "model.text_model.")),
    maps="text_config as Llama (prenorm RMSNorm, rope theta, GQA, head_dim, attention_bias, mlp_bias, SwiGLU); "
         "model.* weights, or the published text_model.model.* and text_model.lm_head.weight (or model.text_model.*)",
    caveats="the language model only: the VQ-VAE image tokenizer (vqmodel.*, vq_config) is skipped; export writes "
            "text_config with model.* names (Emu3ForCausalLM), not the multimodal layout",
)
