"""ModernBERT-decoder (``model_type: modernbert-decoder``, the Ettin decoders): ModernBERT's layers made causal --
a LayerNorm on the token embeddings, pre-norm LayerNorm blocks whose first layer has no attention norm, a GeGLU of
one fused ``Wi``, one global layer in every three (the first) and sliding windows of ``local_attention // 2``
between, a rope of its own per layer type, and BERT's prediction head (dense, activation, LayerNorm) between the
final norm and a tied decoder with a bias."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer.registry.discovery import get_registry

from specformer_hf.config import ACTIVATIONS_TO_HF, ConfigReader, activation_from_hf
from specformer_hf.parts.base import FamilyView, Part, Switch, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.feedforward import GatedFFN
from specformer_hf.parts.windows import LAYER_TYPES, LayerTypeRopes, layer_types_from_config, windowed
from specformer_hf.rules import Copy, Fused, Rule, qkv_sizes
from specformer_hf.specview import NotExpressible

NAME = "ModernBERT-decoder"

#: transformers' ModernBertDecoderConfig defaults (blab-jhu/test-32m-dec is its docstring's checkpoint; the sizes
#: are those of the 150M Ettin decoder). Its rope defaults: 160k for the global layers, 10k for the sliding ones.
DEFAULTS = {
    "vocab_size": 50368, "hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
    "num_attention_heads": 12, "hidden_activation": "gelu", "max_position_embeddings": 8192, "norm_eps": 1e-5,
    "norm_bias": False, "attention_bias": False, "mlp_bias": False, "decoder_bias": True, "classifier_bias": False,
    "classifier_activation": "gelu", "local_attention": 128, "layer_types": None, "tie_word_embeddings": True,
}
#: The older files' layer pattern (not a config field: transformers reads it from the keywords when layer_types is
#: absent), and its default.
EVERY_N_DEFAULT = 3
THETA = {"sliding_attention": 10_000.0, "full_attention": 160_000.0}


def _has_layer_type_ropes(cfg: ConfigReader) -> bool:
    stored = cfg.data.get("rope_parameters")
    return isinstance(stored, dict) and any(t in stored for t in LAYER_TYPES)


@dataclass(frozen=True)
class ModernBertLayers(LayerTypeRopes):
    """layer_types (default: layer i global when ``i % global_attn_every_n_layers == 0``), ``local_attention`` (the
    sliding window is half of it) and the rope of each layer type (``rope_parameters``, or the older
    ``global_rope_theta`` / ``local_rope_theta``) <-> per-layer windows and ropes."""

    pattern: int = 3
    theta: Any = None
    pattern_key: str | None = None
    local_theta_key: str | None = "local_rope_theta"
    flat_is_full: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        every = cfg.get_int("global_attn_every_n_layers", EVERY_N_DEFAULT)
        types = layer_types_from_config(cfg, ["sliding_attention" if i % every else "full_attention"
                                              for i in range(n_layers)])
        local = cfg.get("local_attention")
        cfg.mark_read("sliding_window")  # transformers sets it to local_attention // 2 whatever the file says
        if "sliding_attention" in types and (not isinstance(local, int) or local < 2):
            raise UserError(f"{cfg.family}: local_attention = {local!r} gives the sliding layers no window; "
                            "a whole number of at least 2 is needed (the window is half of it)")
        windowed(model, [local // 2 if t == "sliding_attention" else None for t in types])
        schemes = {t: self._rope(cfg, t) for t in LAYER_TYPES}
        base = max(LAYER_TYPES, key=types.count)
        model["positional"] = schemes[base]
        other = [i for i, t in enumerate(types) if t != base]
        if other and schemes[base] != schemes[types[other[0]]]:
            model.setdefault("layers", []).append({"select": selection(other, n_layers),
                                                   "positional": schemes[types[other[0]]]})

    def _rope(self, cfg: ConfigReader, layer_type: str) -> dict[str, Any]:
        cfg.mark_read("global_rope_theta")
        if layer_type == "full_attention" and not _has_layer_type_ropes(cfg) and cfg.data.get("global_rope_theta"):
            # The older files name the global layers' theta global_rope_theta: read as the rope_theta it stands for.
            legacy = ConfigReader({**cfg.data, "rope_theta": cfg.data["global_rope_theta"]}, defaults=cfg.defaults,
                                  family=cfg.family)
            return super()._rope(legacy, layer_type)
        return super()._rope(cfg, layer_type)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        window = config.pop("sliding_window")
        config["local_attention"] = None if window is None else 2 * window


@dataclass(frozen=True)
class ModernBertEnds(Part):
    """Sizes, heads, LayerNorms (norm_eps, norm_bias) everywhere including the token embeddings'; no attention norm
    on layer 0; the prediction head (classifier_activation, classifier_bias) as ``final_norm: prediction_head``;
    decoder_bias as the LM head's bias."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        d_model, n_heads = cfg.get_size("hidden_size"), cfg.get_size("num_attention_heads")
        if d_model % n_heads:
            raise UserError(f"{cfg.family}: hidden_size {d_model} is not a multiple of num_attention_heads {n_heads}")
        norm: dict[str, Any] = {"kind": "layernorm", "eps": cfg.get_float("norm_eps"), "bias": bool(cfg.get("norm_bias"))}
        model.update({
            "vocab_size": cfg.get_int("vocab_size"), "d_model": d_model, "n_layers": cfg.get_layers("num_hidden_layers"),
            "context_length": cfg.get_int("max_position_embeddings"),
            "tie_embeddings": bool(cfg.get("tie_word_embeddings")), "lm_head_bias": bool(cfg.get("decoder_bias")),
            "embedding_norm": dict(norm),
            "final_norm": {"kind": "prediction_head", "norm": dict(norm), "bias": bool(cfg.get("classifier_bias")),
                           "activation": activation_from_hf(cfg, "classifier_activation")},
        })
        block = model.setdefault("block", {})
        block.update(layout="prenorm", norm=norm)
        block.setdefault("mixer", {}).update(kind="attention", n_heads=n_heads, n_kv_heads=n_heads,
                                             head_dim=d_model // n_heads)
        # The first layer reads the normalised embeddings without a norm of its own.
        model.setdefault("layers", []).insert(0, {"select": 0, "layout": {"mixer_pre_norm": False}})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m, name = view.model, view.name
        view.block_kind("layout", ("prenorm",))
        view.block_kind("norm", ("layernorm",))
        for layout in view.per_layer("layout"):
            if (layout["normed_residual"] or list(layout["residual_scales"]) != [1.0, 1.0]
                    or list(layout["output_scales"]) != [1.0, 1.0] or layout["residual_multiplier"] != 1.0):
                raise NotExpressible("model.block.layout", f"Hugging Face {name}'s blocks add each sublayer's output "
                                     "to the stream as it is (no residual_scales, output_scales, residual_multiplier "
                                     "or normed_residual)")
        pre = [layout["mixer_pre_norm"] for layout in view.per_layer("layout")]
        if pre != [False] + [True] * (m.n_layers - 1):
            raise NotExpressible("model.layers", f"Hugging Face {name} has no attention norm on layer 0 and one on "
                                 "every other layer (layout mixer_pre_norm: false on layer 0 alone)")
        norm = view.uniform("norm", None)
        if not norm["affine"] or norm["offset"]:
            raise NotExpressible("model.block.norm", f"Hugging Face {name}'s LayerNorms have a weight (offset 0)")
        embedding_norm = (get_registry().resolve("norm", m.embedding_norm.as_dict()).to_dict()
                          if m.embedding_norm is not None else None)
        if embedding_norm != norm:
            raise NotExpressible("model.embedding_norm", f"Hugging Face {name} normalises the token embeddings with "
                                 f"the blocks' norm ({norm})")
        head = view.view.final_norm
        if head["kind"] != "prediction_head" or head["norm"] != norm:
            raise NotExpressible("model.final_norm", f"Hugging Face {name} ends with its final norm and a prediction "
                                 f"head: final_norm: {{kind: prediction_head, norm: {norm}}}")
        n_heads = view.view.multi_head(family=name)
        config.update({
            "vocab_size": m.vocab_size, "hidden_size": m.d_model, "num_hidden_layers": m.n_layers,
            "num_attention_heads": n_heads, "max_position_embeddings": m.context_length,
            "tie_word_embeddings": m.tie_embeddings, "decoder_bias": m.lm_head_bias,
            "norm_eps": norm["eps"], "norm_bias": norm["bias"], "classifier_bias": head["bias"],
            "classifier_activation": ACTIVATIONS_TO_HF[head["activation"]],
        })


LAYER = "model.layers.{i}"

WEIGHTS: list[Rule] = [
    Copy("model.embeddings.tok_embeddings.weight", "embedding.weight"),
    Copy("model.embeddings.norm.weight", "embedding_norm.weight"),
    Copy("model.embeddings.norm.bias", "embedding_norm.bias"),
    # Layer 0 has no attn_norm: the rule finds no tensor of ours there and is skipped.
    Copy(f"{LAYER}.attn_norm.weight", "blocks.{i}.attention_norm.weight"),
    Copy(f"{LAYER}.attn_norm.bias", "blocks.{i}.attention_norm.bias"),
    Fused([f"{LAYER}.attn.q_proj.weight", f"{LAYER}.attn.k_proj.weight", f"{LAYER}.attn.v_proj.weight"],
          "blocks.{i}.mixer.qkv.weight", sizes=qkv_sizes),
    Fused([f"{LAYER}.attn.q_proj.bias", f"{LAYER}.attn.k_proj.bias", f"{LAYER}.attn.v_proj.bias"],
          "blocks.{i}.mixer.qkv.bias", sizes=qkv_sizes),
    Copy(f"{LAYER}.attn.Wo.weight", "blocks.{i}.mixer.out.weight"),
    Copy(f"{LAYER}.attn.Wo.bias", "blocks.{i}.mixer.out.bias"),
    Copy(f"{LAYER}.mlp_norm.weight", "blocks.{i}.ffn_norm.weight"),
    Copy(f"{LAYER}.mlp_norm.bias", "blocks.{i}.ffn_norm.bias"),
    # Wi's rows are [input; gate] with act(input) * gate: our gate_up's [gate; up] as it is.
    Copy(f"{LAYER}.mlp.Wi.weight", "blocks.{i}.ffn.gate_up.weight"),
    Copy(f"{LAYER}.mlp.Wi.bias", "blocks.{i}.ffn.gate_up.bias"),
    Copy(f"{LAYER}.mlp.Wo.weight", "blocks.{i}.ffn.down.weight"),
    Copy(f"{LAYER}.mlp.Wo.bias", "blocks.{i}.ffn.down.bias"),
    Copy("model.final_norm.weight", "final_norm.norm.weight"),
    Copy("model.final_norm.bias", "final_norm.norm.bias"),
    Copy("lm_head.dense.weight", "final_norm.dense.weight"),
    Copy("lm_head.dense.bias", "final_norm.dense.bias"),
    Copy("lm_head.norm.weight", "final_norm.head_norm.weight"),
    Copy("lm_head.norm.bias", "final_norm.head_norm.bias"),
    Copy("decoder.weight", "lm_head.weight"),
    Copy("decoder.bias", "lm_head.bias"),
    Copy("decoder.bias", "head_bias.bias"),
]

FAMILY = decoder_family(
    name=NAME,
    model_type="modernbert-decoder",
    architecture="ModernBertDecoderForCausalLM",
    defaults=DEFAULTS,
    parts=[
        ModernBertEnds(),
        ModernBertLayers(theta=THETA),
        Switch("attention_bias", ("mixer.qkv_bias", "mixer.out_bias")),
        GatedFFN(act_key="hidden_activation", bias_key="mlp_bias"),
    ],
    rules=WEIGHTS,
    head_tensor="decoder.weight",
    # Initialisation, dropouts (training only) and token ids.
    non_math_fields=("initializer_range", "initializer_cutoff_factor", "attention_dropout", "embedding_dropout",
                     "mlp_dropout", "classifier_dropout", "cls_token_id", "sep_token_id"),
    maps="embeddings.norm -> model.embedding_norm (layernorm, norm_eps, norm_bias: its bias or none, as every "
         "LayerNorm's); prenorm LayerNorm blocks, layer 0 without attn_norm (layout mixer_pre_norm: false on layer 0); "
         "q/k/v fused, Wo, attention_bias; mlp.Wi ([input; gate]) as a GeGLU's gate_up, hidden_activation, mlp_bias; "
         "layer_types (default: global_attn_every_n_layers) with local_attention // 2 as the sliding window, "
         "rope_parameters per layer type (or global_rope_theta / local_rope_theta) -> per-layer positional; "
         "final_norm and lm_head (dense, classifier_activation, norm; classifier_bias) -> final_norm: "
         "prediction_head; decoder (tied or not) with decoder_bias -> the LM head and lm_head_bias",
    caveats="the sliding window is local_attention // 2 (transformers' reading; sliding_window in config.json is "
            "ignored, as transformers recomputes it); export writes layer_types and local_attention = 2 x window",
)
