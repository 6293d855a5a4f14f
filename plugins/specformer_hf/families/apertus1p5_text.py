"""Apertus 1.5's text model (``model_type: apertus1p5_text``): Apertus over a vocabulary extended with image and
audio codes; an LM head pruned to the text ids (``output_vocab_size``) is refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families.apertus import APERTUS_PARTS, CAVEATS, DEFAULTS, MAPS
from specformer_hf.parts.base import FamilyView, Part
from specformer_hf.parts.decoder import decoder_family


@dataclass(frozen=True)
class UnprunedHead(Part):
    """output_vocab_size: null (or vocab_size) only -- the head predicts every token id the model reads."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        rows = cfg.get("output_vocab_size", None)
        if rows is not None and rows != cfg.get_size("vocab_size"):
            raise UserError(f"{cfg.family}: output_vocab_size {rows} prunes the LM head below vocab_size "
                            f"({cfg.get_size('vocab_size')}); specformer's head predicts every id it reads, so only "
                            "an unpruned head (output_vocab_size null) is supported")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        config["output_vocab_size"] = None

    def rules(self) -> list:
        return []


FAMILY = decoder_family(
    name="Apertus 1.5 (text)",
    model_type="apertus1p5_text",
    architecture="Apertus1p5TextForCausalLM",
    defaults={**DEFAULTS, "vocab_size": 266752, "output_vocab_size": None},
    parts=[*APERTUS_PARTS, UnprunedHead()],
    maps=MAPS.replace("as Llama", "as Apertus: as Llama", 1),
    caveats=CAVEATS + "; output_vocab_size must be null or vocab_size (a pruned LM head, as the released checkpoints "
                      "have, is refused)",
)
