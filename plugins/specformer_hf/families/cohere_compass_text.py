"""Cohere Compass text (``model_type: cohere_compass_text``, the language model of Cohere's North vision models):
Cohere2's parallel blocks under one bias-free LayerNorm with full and sliding layers by layer_types, but a rope (or
none) per layer type, rotating halves as Qwen3 does, and logits scaled only when logit_scale is set.

Its rope is Qwen3-VL's multimodal one (mrope_section): on text, whose three position rows are equal, it turns
positions exactly as a plain rope does, so the sections are read and dropped, as for Qwen3.5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import Attention
from specformer_hf.parts.base import FamilyView, Part, Switch, selection
from specformer_hf.parts.decoder import decoder_family, language_model_of
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.norms import LayerNorm, Layout
from specformer_hf.parts.positions import rope, rope_parameters_of
from specformer_hf.parts.windows import LAYER_TYPES, layer_types_from_config, windowed
from specformer_hf.specview import NotExpressible

#: transformers' CohereCompassTextConfig defaults (those of Cohere2Config it extends; rope_parameters has no entry
#: per layer type, which transformers' model cannot run: a config must give them).
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "logit_scale": None,
    "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": None, "hidden_act": "silu",
    "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False,
    "sliding_window": 4096, "layer_types": None, "rope_parameters": {},
}

#: The multimodal rope's keys, which change nothing on text.
_MROPE = ("mrope_section", "mrope_interleaved")


@dataclass(frozen=True)
class LayerTypeRopesOrNone(Part):
    """layer_types (default all full), sliding_window and ``rope_parameters: {layer_type: {...} or null}`` <->
    per-layer windows and per-layer ropes, ``positional: none`` where a layer type's entry is null."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = layer_types_from_config(cfg, ["full_attention"] * n_layers)
        window = cfg.get("sliding_window")
        windowed(model, [window if t == "sliding_attention" else None for t in types])
        stored = cfg.get("rope_parameters")
        cfg.mark_read("rope_theta", "rope_scaling")
        if not isinstance(stored, dict):
            raise UserError(f"{cfg.family}: rope_parameters must map each layer type to its rope (or null: no "
                            f"positions), got {stored!r}")
        schemes = {t: self._scheme(cfg, stored, t) for t in dict.fromkeys(types)}
        base = max(schemes, key=types.count)  # the scheme of most layers is the model's
        model["positional"] = schemes[base]
        for layer_type, scheme in schemes.items():
            if layer_type != base and scheme != schemes[base]:
                mine = [i for i, t in enumerate(types) if t == layer_type]
                model.setdefault("layers", []).append({"select": selection(mine, n_layers), "positional": scheme})

    def _scheme(self, cfg: ConfigReader, stored: dict[str, Any], layer_type: str) -> dict[str, Any]:
        if layer_type not in stored:
            raise UserError(f"{cfg.family}: rope_parameters has no entry for {layer_type} layers (transformers' model "
                            f"reads rope_parameters[{layer_type!r}]); give a rope mapping, or null for no positions")
        params = stored[layer_type]
        if params is None:
            return {"kind": "none"}
        if not isinstance(params, dict):
            raise UserError(f"{cfg.family}: rope parameters of {layer_type} layers must be a mapping or null, got "
                            f"{params!r}")
        single = ConfigReader({"rope_parameters": {k: v for k, v in params.items() if k not in _MROPE},
                               "max_position_embeddings": cfg.get("max_position_embeddings")},
                              defaults={}, family=f"{cfg.family} ({layer_type} layers)")
        scheme = rope(single)
        cfg.unused.extend(single.unused)
        return scheme

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("mixer", "window")
        sliding = {w for w in windows if w is not None}
        if len(sliding) > 1:
            raise NotExpressible("model.layers[*].mixer.window", f"several window sizes {sorted(sliding)}; Hugging "
                                 f"Face {view.name} has one sliding_window")
        types = ["sliding_attention" if w is not None else "full_attention" for w in windows]
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        params: dict[str, Any] = {}
        for layer_type in LAYER_TYPES:
            mine = [(i, s) for i, (t, s) in enumerate(zip(types, schemes)) if t == layer_type]
            for i, scheme in mine[1:]:
                if scheme != mine[0][1]:
                    raise NotExpressible(f"model.layers[{i}].positional", f"differs from layer {mine[0][0]}'s; Hugging "
                                         f"Face {view.name} has one rope (or none) for all {layer_type} layers")
            if mine:
                first, scheme = mine[0]
                params[layer_type] = None if scheme["kind"] == "none" else rope_parameters_of(
                    scheme, view.name, path=f"model.layers[{first}].positional",
                    context_length=view.model.context_length)
        # transformers' model builds the sliding mask whatever the layer types, and refuses a null sliding_window
        # there: with no sliding layer, the default stands (no layer reads it).
        config.update(rope_parameters=params, layer_types=types,
                      sliding_window=sliding.pop() if sliding else DEFAULTS["sliding_window"])


@dataclass(frozen=True)
class OptionalLogitScale(Part):
    """logit_scale, where null (the default) means the logits are not scaled."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        scale = cfg.get("logit_scale")
        model["logit_scale"] = 1.0 if scale is None else float(scale)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        scale = view.get("logit_scale")
        config["logit_scale"] = None if scale in (None, 1.0) else scale


@dataclass(frozen=True)
class HeadDimOfHidden(Part):
    """head_dim, which the config saves but always recomputes as hidden_size / num_attention_heads."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        cfg.mark_read("head_dim", "pooling")  # pooling: the sequence-classification head's, not the causal LM's

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        pass


FAMILY = decoder_family(
    name="Cohere Compass text",
    model_type="cohere_compass_text",
    architecture="CohereCompassForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        LayerTypeRopesOrNone(),
        Layout("parallel"),
        LayerNorm(bias=False),
        Attention(head_dim=False),
        HeadDimOfHidden(),
        GatedFFN(),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        OptionalLogitScale(),
    ],
    maps="as Cohere2 (layout parallel with one shared bias-free LayerNorm, GQA, attention_bias, SwiGLU, layer_types "
         "and sliding_window -> per-layer windows) with rope_parameters per layer type (null: positional none) "
         "rotating halves, and logit_scale (null: 1)",
    caveats="head_dim is always hidden / heads; the multimodal rope sections (mrope_section) are dropped, as they "
            "turn text positions like a plain rope",
)

#: The published checkpoints (CohereLabs/North-*-Vision): Qwen3-VL's layout, read for the language model.
MULTIMODAL = language_model_of(FAMILY, name="Cohere Compass text (multimodal)", model_type="cohere_compass",
                               architecture="CohereCompassForConditionalGeneration")
