"""Ministral 3 (``model_type: ministral3``, Ministral-3-8B and its 3B and 14B siblings' text models): Mistral's blocks
with Llama 4's query temperature on every layer.

Prenorm RMSNorm, grouped-query attention with a head_dim of its own, SwiGLU, no biases, one optional
``sliding_window`` for every layer (as Mistral), a YaRN rope by default; and each query, after the rope, is
multiplied by ``1 + llama_4_scaling_beta * ln(1 + floor(position / original_max_position_embeddings))``, both
read from the rope parameters: the attention's ``temperature_tuning`` with ``temperature_position_offset`` 0
(Llama 4 counts positions from 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader, rope_parameters
from specformer_hf.parts.base import FamilyView, Value
from specformer_hf.parts.decoder import LLAMA_PARTS, decoder_family, replace_part
from specformer_hf.parts.positions import Rope, rope
from specformer_hf.specview import NotExpressible

#: transformers' Ministral3Config defaults (Ministral-3-8B's text model; the rope parameters its __post_init__ fills in).
DEFAULTS = {
    "vocab_size": 131072, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 34,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "hidden_act": "silu",
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "sliding_window": None,
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                        "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
                        "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1},
}

BETA, ORIGINAL = "llama_4_scaling_beta", "original_max_position_embeddings"


@dataclass(frozen=True)
class Ministral3Rope(Rope):
    """The rope parameters, whose llama_4_scaling_beta and original_max_position_embeddings also give the query
    temperature (beta 0: none) <-> the rope and the attention's temperature_tuning (position offset 0)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        # A file's own rope parameters stand alone (transformers fills in its YaRN defaults only when there are none):
        # merged with the defaults, a plain rope would gain YaRN's fields.
        own = cfg.data.get("rope_parameters") is not None or cfg.data.get("rope_scaling") is not None
        params = rope_parameters(ConfigReader(cfg.data, defaults={}, family=cfg.family) if own else cfg)
        cfg.mark_read("rope_parameters", "rope_scaling", "rope_theta")
        beta, original = params.pop(BETA, None), params.get(ORIGINAL)
        if not isinstance(beta, (int, float)) or isinstance(beta, bool) or beta < 0:
            raise UserError(f"{cfg.family}: rope_parameters.{BETA} must be a number >= 0 (transformers' Ministral 3 "
                            f"scales every query by it; 0: no scaling), got {beta!r}")
        if beta and (not isinstance(original, (int, float)) or isinstance(original, bool) or original <= 0):
            raise UserError(f"{cfg.family}: rope_parameters.{ORIGINAL} must be a positive number (the positions per "
                            f"step of the query scaling), got {original!r}")
        if params["rope_type"] not in ("yarn", "llama3", "longrope"):
            params.pop(ORIGINAL, None)  # the temperature's alone: the rope does not read it
        params.pop("max_position_embeddings", None)  # __post_init__'s default writes it there; nothing reads it
        # What is left is the rope's, read as one config of its own (the family's defaults would put the beta back).
        single = ConfigReader({"rope_parameters": params, "max_position_embeddings": cfg.get("max_position_embeddings")},
                              defaults={}, family=cfg.family)
        model["positional"] = rope(single)
        cfg.unused.extend(single.unused)
        if beta:
            model.setdefault("block", {}).setdefault("mixer", {}).update(
                temperature_tuning=True, temperature_floor_scale=float(original), temperature_attn_scale=float(beta),
                temperature_position_offset=0)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        config.pop("rope_scaling", None)  # transformers 5 only: rope_parameters alone
        config.pop("rope_theta", None)
        params = config["rope_parameters"]
        mixer = view.uniform("mixer")
        if not mixer.get("temperature_tuning"):
            params.update({BETA: 0.0, ORIGINAL: params.get(ORIGINAL, view.model.context_length)})
            return
        floor = mixer["temperature_floor_scale"]
        if mixer.get("temperature_position_offset", 1) != 0 or floor != math.floor(floor):
            raise NotExpressible("model.block.mixer.temperature_position_offset", f"Hugging Face {view.name} scales "
                                 "queries from position 0 (temperature_position_offset: 0) in steps of a whole number "
                                 f"of positions (temperature_floor_scale), got {mixer.get('temperature_position_offset')} "
                                 f"and {floor}")
        if params.get(ORIGINAL, int(floor)) != int(floor):
            raise NotExpressible("model.block.mixer.temperature_floor_scale", f"{floor}: Hugging Face {view.name} steps "
                                 f"the query scaling every {ORIGINAL} positions, the rope's original context "
                                 f"({params[ORIGINAL]})")
        params.update({BETA: mixer["temperature_attn_scale"], ORIGINAL: int(floor)})


FAMILY = decoder_family(
    name="Ministral 3",
    model_type="ministral3",
    architecture="Ministral3ForCausalLM",
    defaults=DEFAULTS,
    parts=[*replace_part(LLAMA_PARTS, Ministral3Rope(), instead_of=Rope), Value("sliding_window", "mixer.window")],
    maps="as Mistral (prenorm RMSNorm, rope (YaRN by default), GQA, head_dim, SwiGLU, sliding_window on every layer); "
         "rope_parameters' llama_4_scaling_beta and original_max_position_embeddings -> temperature_tuning "
         "(attn_scale, floor_scale, position offset 0; beta 0: none)",
    caveats="no biases; the query scaling steps every original_max_position_embeddings positions, the YaRN rope's "
            "original context too",
)
