"""The family builder: a Hugging Face family written as a table of parts.

A Llama-like family is written as a table (see :func:`decoder_family`): the transformers
config defaults, and a list of :class:`~specformer_hf.parts.base.Part` objects, each stating
one mapping in both directions -- which ``config.json`` fields become which spec fields, and
back -- together with the checkpoint tensors it accounts for::

    FAMILY = decoder_family(
        name="Mistral", model_type="mistral", architecture="MistralForCausalLM", defaults=DEFAULTS,
        parts=[*LLAMA_PARTS, Value("sliding_window", "mixer.window")],
    )

``to_spec`` (config -> spec) runs every part's ``read`` in order; ``to_config`` (spec ->
config) every part's ``write``; the weight rules are the parts' ``rules``. Export reads its
own config back with ``to_spec`` and compares the maths, so a part only needs to refuse what
it cannot write with a clear message.

The parts live beside this module, one concept each: :mod:`.base` (the protocol and the
single-field parts), :mod:`.embedding`, :mod:`.norms`, :mod:`.attention`, :mod:`.positions`,
:mod:`.windows`, :mod:`.feedforward`, :mod:`.multipliers`, :mod:`.mamba2` and :mod:`.deltanet`.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.family import Family
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import FamilyView, Part
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import Rule
from specformer_hf.specview import ExportsAs, NotExpressible, SpecView

#: What a Llama-style decoder is made of: sizes, RoPE, pre-norm RMSNorm blocks, GQA, a gated feed-forward.
LLAMA_PARTS: tuple[Part, ...] = (Sizes(), Rope(), Layout("prenorm"), RMSNorm(), Attention(), GatedFFN())


def decoder_family(*, name: str, model_type: str, architecture: str, defaults: Mapping[str, Any],
                   parts: Sequence[Part], extra_rules: Sequence[Rule] = (), rules: Sequence[Rule] | None = None,
                   **family: Any) -> Family:
    """A :class:`Family` made of ``parts``: to_spec, to_config and the weight rules are theirs, in order.

    ``rules`` replaces the parts' weight rules (a family with its own tensor names);
    ``extra_rules`` adds to them. Other keywords are :class:`Family` fields (maps, caveats, ...).
    """
    parts = tuple(parts)

    def to_spec(cfg: ConfigReader) -> dict[str, Any]:
        model: dict[str, Any] = {}
        for part in parts:
            part.read(cfg, model)
        return model

    def to_config(view: SpecView) -> dict[str, Any]:
        asked, config = FamilyView(view, name), {}
        for part in parts:
            part.write(asked, config)
        return config

    weights = list(rules) if rules is not None else [rule for part in parts for rule in part.rules()]
    return Family(name=name, model_type=model_type, architecture=architecture, defaults=dict(defaults),
                  to_spec=to_spec, to_config=to_config, weights=weights + list(extra_rules), **family)


def replace_part(parts: Sequence[Part], new: Part, *, instead_of: type[Part] | None = None) -> tuple[Part, ...]:
    """``parts`` with the part of type ``instead_of`` (default: ``new``'s type) swapped for ``new``."""
    old = instead_of or type(new)
    if not any(type(p) is old for p in parts):
        raise ValueError(f"no {old.__name__} part to replace")
    return tuple(new if type(p) is old else p for p in parts)


# -- the multimodal checkpoints' language model ---------------------------------------------------------


def language_model_of(text: Family, *, name: str, model_type: str, architecture: str,
                      skipped: tuple[str, ...] = (r"model\.visual\..*",),
                      skipped_what: str = "the vision encoder (model.visual.*) is") -> Family:
    """The family reading ``text``'s model out of a multimodal checkpoint (Qwen3.5's and Gemma 4's published ones).

    config.json nests the language model's fields under ``text_config`` and ties the head at
    the top level (``tie_word_embeddings``, as the multimodal model does); the weights sit under
    ``model.language_model.`` and the other encoders' (``skipped``, in words ``skipped_what``:
    Qwen3.5's ``model.visual.*``) are skipped, as transformers skips them when it loads such a checkpoint as a causal LM.
    Export writes the text family's layout: this family expresses no spec.
    """

    def to_spec(cfg: ConfigReader) -> dict[str, Any]:
        inner = cfg.get("text_config", None)
        if not isinstance(inner, dict):
            raise UserError(f"{cfg.family}: config.json needs a 'text_config' mapping (the language model's fields), "
                            f"got {inner!r}")
        reader = ConfigReader(inner, defaults=text.defaults, family=f"{cfg.family} text_config",
                              max_layers=cfg.max_layers)
        model = text.to_spec(reader)
        model["tie_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
        cfg.mark_read(*cfg.data)  # the vision encoder's settings and the image/video token ids: not the text model's
        cfg.unused.extend(f"text_config.{key}" for key in reader.unread(also_harmless=text.non_math_fields))
        return model

    def to_config(view: Any) -> dict[str, Any]:
        raise ExportsAs("", f"export writes the language model alone, as Hugging Face {text.name} "
                            f"({text.model_type})", target=text.model_type)

    return Family(name=name, model_type=model_type, architecture=architecture, defaults={}, to_spec=to_spec,
                  to_config=to_config, weights=text.weights,
                  ignore_tensors=(*text.ignore_tensors, *skipped), mtp_layer=text.mtp_layer,
                  aliases=(("model.", "model.language_model."),),
                  maps=f"text_config as {text.name} ({text.model_type}); model.language_model.* weights; top-level "
                       "tie_word_embeddings",
                  caveats=f"the language model only: {skipped_what} skipped; export writes {text.model_type}")


__all__ = ["LLAMA_PARTS", "decoder_family", "language_model_of", "replace_part"]
