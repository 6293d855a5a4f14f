"""Gemma 3 text (``model_type: gemma3_text``, ``Gemma3ForCausalLM``): Gemma 2's sandwich blocks with (1 + w) RMSNorm on
query and key heads, five sliding-window layers to one global layer, and a rope of its own for each kind of layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families.common import (LLAMA_PARTS, EmbeddingScale, FamilyView, Fixed, GatedFFN, Layout, Part, QKNorm,
                                           QueryScale, RMSNorm, Refuse, Rope, Switch, Value, _selection, _windowed,
                                           decoder_family, layer_types_from_config, replace_part, rope,
                                           rope_parameters_of)
from specformer_hf.specview import NotExpressible

#: transformers' Gemma3TextConfig defaults (its rope defaults: 10k for sliding layers, 1M for global ones).
DEFAULTS = {
    "vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "attention_bias": False,
    "query_pre_attn_scalar": 256, "sliding_window": 4096, "layer_types": None, "final_logit_softcapping": None,
    "attn_logit_softcapping": None, "use_bidirectional_attention": False,
}
THETA = {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}
TYPES = ("sliding_attention", "full_attention")


@dataclass(frozen=True)
class LayerTypeRopes(Part):
    """layer_types (default: every sliding_window_pattern-th layer global), sliding_window and rope_parameters per
    layer type <-> per-layer windows and per-layer rope schemes.

    transformers 5 writes ``rope_parameters: {sliding_attention: {...}, full_attention: {...}}``; older files have
    ``rope_theta`` and ``rope_scaling`` (global layers) and ``rope_local_base_freq`` (sliding layers).
    """

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        pattern = cfg.get("sliding_window_pattern", 6)
        types = layer_types_from_config(cfg, ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                              for i in range(n_layers)])
        window = cfg.get("sliding_window")
        _windowed(model, [window if t == "sliding_attention" else None for t in types])
        schemes = {t: self._rope(cfg, t) for t in TYPES}
        base = max(TYPES, key=types.count)  # the scheme of most layers is the model's
        model["positional"] = schemes[base]
        other = [i for i, t in enumerate(types) if t != base]
        if other and schemes[base] != schemes[types[other[0]]]:
            model.setdefault("layers", []).append({"select": _selection(other, n_layers), "positional": schemes[types[other[0]]]})

    @staticmethod
    def _rope(cfg: ConfigReader, layer_type: str) -> dict[str, Any]:
        # transformers 5 saves the pattern as _sliding_window_pattern; layer_types, always saved too, say the same.
        cfg.mark_read("rope_parameters", "rope_scaling", "rope_theta", "rope_local_base_freq", "sliding_window_pattern",
                      "_sliding_window_pattern")
        stored = cfg.data.get("rope_parameters")
        if isinstance(stored, dict) and any(t in stored for t in TYPES):
            params = dict(stored.get(layer_type) or {})
        elif layer_type == "full_attention":
            params = {**(cfg.data.get("rope_scaling") or stored or {})}
            if cfg.data.get("rope_theta") is not None:
                params.setdefault("rope_theta", cfg.data["rope_theta"])
        else:
            params = {"rope_type": "default"}
            if cfg.data.get("rope_local_base_freq") is not None:
                params["rope_theta"] = cfg.data["rope_local_base_freq"]
        if not isinstance(params, dict):
            raise UserError(f"{cfg.family}: rope parameters of {layer_type} layers must be a mapping, got {params!r}")
        params.setdefault("rope_theta", THETA[layer_type])
        # One layer type's rope, read by the shared rope reader as if it were the whole config's.
        single = ConfigReader({"rope_parameters": params, "max_position_embeddings": cfg.get("max_position_embeddings")},
                              defaults={}, family=f"{cfg.family} ({layer_type} layers)")
        scheme = rope(single)
        cfg.unused.extend(single.unused)
        return scheme

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        windows = view.per_layer("attention", "window")
        sliding = {w for w in windows if w is not None}
        if len(sliding) > 1:
            raise NotExpressible("model.layers[*].attention.window", f"several window sizes {sorted(sliding)}; Hugging Face {view.name} has one sliding_window")
        types = ["sliding_attention" if w is not None else "full_attention" for w in windows]
        schemes = [scheme or view.positional for scheme in view.per_layer("positional")]
        params: dict[str, Any] = {}
        for layer_type in TYPES:
            mine = [(i, s) for i, (t, s) in enumerate(zip(types, schemes)) if t == layer_type]
            for i, scheme in mine[1:]:
                if scheme != mine[0][1]:
                    raise NotExpressible(f"model.layers[{i}].positional", f"differs from layer {mine[0][0]}'s; Hugging Face "
                                         f"{view.name} has one rope for all {layer_type} layers")
            if mine:
                params[layer_type] = rope_parameters_of(mine[0][1], view.name, path=f"model.layers[{mine[0][0]}].positional",
                                                        context_length=view.model.context_length)
        for layer_type in TYPES:  # a type no layer has still needs parameters
            params.setdefault(layer_type, next(iter(params.values())))
        config.update(rope_parameters=params, layer_types=types, sliding_window=sliding.pop() if sliding else None)


PARTS = replace_part(replace_part(replace_part(LLAMA_PARTS, Layout("sandwich")), RMSNorm(offset=1.0)),
                     GatedFFN(act_key="hidden_activation", gemma_gelu=True))

FAMILY = decoder_family(
    name="Gemma 3",
    model_type="gemma3_text",
    architecture="Gemma3ForCausalLM",
    defaults=DEFAULTS,
    parts=[
        Refuse("use_bidirectional_attention", (None, False), why="Gemma 3 with bidirectional attention is not a causal LM"),
        *replace_part(PARTS, LayerTypeRopes(), instead_of=Rope),
        EmbeddingScale(),
        Switch("attention_bias", ("attention.qkv_bias", "attention.out_bias")),
        QKNorm("head", offset=1.0),
        QueryScale(),
        # transformers 5.24's Gemma3Attention keeps attn_logit_softcapping but never passes it to any attention
        # kernel (eager included), unlike Gemma 2's; Google's reference would apply it. Every published Gemma 3
        # config has null, so a value is refused rather than read one way or the other.
        Refuse("attn_logit_softcapping", (None,),
               why="transformers' Gemma 3 stores it but never applies it (in any attention implementation), so such a "
                   "config has no agreed meaning; every published Gemma 3 config has null"),
        Fixed("attention.logit_softcap", None, why="does not soft-cap attention scores (transformers ignores "
                                                   "attn_logit_softcapping in Gemma 3)"),
        Value("final_logit_softcapping", "logit_softcap"),
    ],
    maps="as Gemma 2 (sandwich norms, (1 + w) RMSNorm, sqrt(d) embeddings, query_pre_attn_scalar) with qk_norm "
         "((1 + w) RMSNorm per head), layer_types / sliding_window_pattern -> per-layer windows, and "
         "rope_parameters per layer type (or rope_theta + rope_scaling and rope_local_base_freq) -> per-layer positional",
    caveats="text only (Gemma3ForCausalLM); model_type gemma3_text; attn_logit_softcapping must be null (transformers "
            "never applies it to Gemma 3)",
)
