"""The model's ends: its sizes, the token embedding (and its scale), the final norm and the LM head."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import FamilyView, Part
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible, SpecView


def model_sizes(cfg: ConfigReader) -> dict[str, Any]:
    """The spec's top-level sizes and head tying."""
    return {
        "vocab_size": cfg.get_int("vocab_size"),
        "d_model": cfg.get_int("hidden_size"),
        "n_layers": cfg.get_layers("num_hidden_layers"),
        "context_length": cfg.get_int("max_position_embeddings"),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings")),
    }


def model_sizes_config(view: SpecView) -> dict[str, Any]:
    m = view.model
    return {
        "vocab_size": m.vocab_size,
        "hidden_size": m.d_model,
        "num_hidden_layers": m.n_layers,
        "max_position_embeddings": m.context_length,
        "tie_word_embeddings": m.tie_embeddings,
    }


def no_output_bias(view: SpecView, family: str) -> None:
    """Families without an LM head bias or a separate final norm setting."""
    if view.model.lm_head_bias:
        raise NotExpressible("model.lm_head_bias", f"Hugging Face {family} has no LM head bias")


@dataclass(frozen=True)
class Sizes(Part):
    """vocab_size, hidden_size, num_hidden_layers, max_position_embeddings, tie_word_embeddings; embedding, final norm, head."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.update(model_sizes(cfg))

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        no_output_bias(view.view, view.name)
        config.update(model_sizes_config(view.view))

    def rules(self) -> list[Rule]:
        return [Copy("model.embed_tokens.weight", "embedding.weight"), Copy("model.norm.weight", "final_norm.weight"),
                Copy("lm_head.weight", "lm_head.weight")]


@dataclass(frozen=True)
class EmbeddingScale(Part):
    """Embeddings multiplied by sqrt(hidden_size), always (Gemma)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model["embedding_multiplier"] = "sqrt_d_model"

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m = view.model
        if m.embedding_multiplier != "sqrt_d_model" and float(m.embedding_multiplier) != m.d_model ** 0.5:
            raise NotExpressible("model.embedding_multiplier", f"{m.embedding_multiplier!r}: Hugging Face {view.name} always scales embeddings by sqrt(d_model)")


def embedding_multiplier_config(model: Any) -> float:
    """The model's ``embedding_multiplier`` as the number a config holds (``sqrt_d_model`` worked out)."""
    if model.embedding_multiplier == "sqrt_d_model":
        return model.d_model ** 0.5
    return float(model.embedding_multiplier)


__all__ = ["EmbeddingScale", "Sizes", "embedding_multiplier_config", "model_sizes", "model_sizes_config", "no_output_bias"]
