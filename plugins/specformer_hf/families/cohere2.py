"""Cohere2 (``model_type: cohere2``, Command R7B / Command A): parallel blocks under one bias-free LayerNorm, three
sliding-window layers with interleaved rope to one global layer without positions, and scaled logits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer_hf.config import ConfigReader
from specformer_hf.families.common import (Attention, FamilyView, GatedFFN, LayerNorm, Layout, Part, Sizes, Switch,
                                           Value, _selection, _windowed, decoder_family, layer_types_from_config,
                                           rope, rope_parameters_of)
from specformer_hf.specview import NotExpressible

#: transformers' Cohere2Config defaults.
DEFAULTS = {
    "vocab_size": 256000, "hidden_size": 8192, "intermediate_size": 22528, "logit_scale": 0.0625,
    "num_hidden_layers": 40, "num_attention_heads": 64, "num_key_value_heads": None, "hidden_act": "silu",
    "max_position_embeddings": 8192, "layer_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False,
    "sliding_window": 4096, "layer_types": None, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}


@dataclass(frozen=True)
class SlidingRopeGlobalNope(Part):
    """layer_types (default: every sliding_window_pattern-th layer global), sliding_window and rope_parameters <->
    per-layer windows, an interleaved rope on the sliding layers and ``positional: none`` on the global ones."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        pattern = cfg.get("sliding_window_pattern", 4)
        cfg.mark_read("sliding_window_pattern", "_sliding_window_pattern")
        types = layer_types_from_config(cfg, ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                              for i in range(n_layers)])
        window = cfg.get("sliding_window")
        _windowed(model, [window if t == "sliding_attention" else None for t in types])
        model["positional"] = {**rope(cfg), "interleaved": True}  # Cohere rotates adjacent pairs
        full = [i for i, t in enumerate(types) if t == "full_attention"]
        if full:
            model.setdefault("layers", []).append({"select": _selection(full, n_layers), "positional": "none"})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("attention", "window")
        sliding = {w for w in windows if w is not None}
        if len(sliding) != 1:
            raise NotExpressible("model.layers[*].attention.window", f"Hugging Face {view.name} has one sliding_window "
                                 f"on its local layers (got {sorted(sliding) or 'none'})")
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        for i, (window, scheme) in enumerate(zip(windows, schemes)):
            wanted = "rope" if window is not None else "none"
            if scheme["kind"] != wanted or (wanted == "rope" and scheme != view.positional):
                raise NotExpressible(f"model.layers[{i}].positional", f"Hugging Face {view.name}'s "
                                     f"{'sliding' if window else 'global'} layers use {wanted}"
                                     + (" (model.positional)" if wanted == "rope" else ""))
        pos = view.positional
        if not pos.get("interleaved"):
            raise NotExpressible("model.positional.interleaved", f"Hugging Face {view.name} rotates adjacent pairs (interleaved: true)")
        params = rope_parameters_of({**pos, "interleaved": False}, view.name, path="model.positional",
                                    context_length=view.model.context_length)
        config.update(rope_parameters=params, sliding_window=sliding.pop(),
                      layer_types=["sliding_attention" if w is not None else "full_attention" for w in windows])


FAMILY = decoder_family(
    name="Cohere2",
    model_type="cohere2",
    architecture="Cohere2ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Sizes(),
        SlidingRopeGlobalNope(),
        Layout("parallel"),
        LayerNorm(bias=False),
        Attention(head_dim=False),
        GatedFFN(),
        Switch("attention_bias", ("attention.qkv_bias", "attention.out_bias")),
        Value("logit_scale", "logit_scale"),
    ],
    maps="layout parallel with one shared bias-free LayerNorm, logit_scale, GQA, attention_bias, SwiGLU, layer_types / "
         "sliding_window_pattern -> per-layer windows, interleaved rope on sliding layers and positional none on "
         "global ones",
    caveats="head_dim is always hidden / heads",
)
