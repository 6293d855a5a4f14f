"""LFM2 (``model_type: lfm2``, Liquid AI): gated short convolutions with a few attention layers between them.

Each layer is either a ``conv`` layer (LFM2's gated short convolution: the ``short_conv``
mixer) or a ``full_attention`` one (grouped-query attention with an RMSNorm per head on
queries and keys); ``layer_types`` (or the older ``full_attn_idxs``) says which. The
commoner kind becomes the block's mixer and the others ``layers:`` overrides. Both kinds
sit in pre-norm blocks (``operator_norm``, ``ffn_norm``) with a SwiGLU feed-forward
(``w1`` gate, ``w3`` up, ``w2`` down) whose width LFM2 derives from ``intermediate_size``
unless ``block_auto_adjust_ff_dim`` is off; the final norm is ``embedding_norm``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import BLOCK_MIXER, LAYER, FamilyView, Part, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes, model_sizes
from specformer_hf.parts.norms import RMSNorm, rmsnorm
from specformer_hf.parts.positions import Rope
from specformer_layers import default_gated_hidden
from specformer_hf.rules import Copy, DepthwiseConv, Fused, Rule, Site, halves, qkv_sizes
from specformer_hf.specview import NotExpressible

#: transformers' Lfm2Config defaults.
DEFAULTS = {
    "vocab_size": 65536, "hidden_size": 2560, "intermediate_size": 12288, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 128_000, "norm_eps": 1e-5,
    "tie_word_embeddings": True, "conv_bias": False, "conv_L_cache": 3, "block_multiple_of": 256,
    "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": True, "full_attn_idxs": None, "layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
}

#: Fields of LFM2's first published configs that transformers' Lfm2 model never reads (duplicates of the fields
#: it does read, and initialisation settings).
LEGACY_FIELDS = ("block_dim", "block_norm_eps", "block_use_swiglu", "block_use_xavier_init", "block_mlp_init_scale",
                 "block_out_init_scale", "conv_dim", "conv_dim_out", "conv_use_xavier_init", "num_heads")

CONV, ATTENTION = "conv", "full_attention"
SELF_ATTN = f"{LAYER}.self_attn"
SHORT_CONV = f"{LAYER}.conv"
FFN = f"{LAYER}.feed_forward"


# -- per-layer mixers ---------------------------------------------------------------------------------


def _mixer_kind(site: Site) -> str:
    return "short_conv" if getattr(site.mixer, "state_slots", None) is not None else "attention"


class OnMixer(Rule):
    """``rule`` in the layers whose mixer is ``mixer`` (``short_conv`` or ``attention``); nothing in the others.

    LFM2's two kinds of layer both have an output projection, which is ``mixer.out`` in
    ours and ``conv.out_proj`` or ``self_attn.out_proj`` in a checkpoint: each rule must be
    applied to its own kind of layer only. Elsewhere it names a parameter no model has, so
    import and export skip it as they skip a bias the spec leaves out.
    """

    def __init__(self, rule: Rule, *, mixer: str) -> None:
        self.rule, self.mixer = rule, mixer
        self.hf, self.ours = rule.hf, rule.ours

    @property
    def per_layer(self) -> bool:
        return True

    def _elsewhere(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (), (f"(layer {site.layer} has no {self.mixer})",)

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return self.rule.expand_at(site) if _mixer_kind(site) == self.mixer else self._elsewhere(site)

    def for_import(self, site: Site, present: Callable[[str], bool]) -> tuple[Rule, tuple[str, ...], tuple[str, ...]]:
        if _mixer_kind(site) == self.mixer:
            return self.rule.for_import(site, present)
        return (self, *self._elsewhere(site))

    def to_ours(self, tensors: list[Any], site: Site) -> list[Any]:
        return self.rule.to_ours(tensors, site)

    def to_hf(self, tensors: list[Any], site: Site) -> list[Any]:
        return self.rule.to_hf(tensors, site)

    def describe(self) -> str:
        return f"{self.rule.describe()} (in {self.mixer} layers)"


def _layer_types(cfg: ConfigReader, n_layers: int) -> list[str]:
    """layer_types, else full_attn_idxs (attention there, conv elsewhere), else attention everywhere (as transformers)."""
    types = cfg.get("layer_types")
    # read either way: transformers ignores it once layer_types is set (LFM2-MoE's config has no such field)
    indices = cfg.get("full_attn_idxs", None)
    if types is None:
        if indices is None:
            indices = list(range(n_layers))
        if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
            raise UserError(f"{cfg.family}: full_attn_idxs must list layer indices, got {indices!r}")
        types = [ATTENTION if i in indices else CONV for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers:
        raise UserError(f"{cfg.family}: layer_types must list one type for each of the {n_layers} layers, got {types!r}")
    bad = sorted({repr(t) for t in types if t not in (CONV, ATTENTION)})
    if bad:
        raise UserError(f"{cfg.family}: layer_types {', '.join(bad)} are not supported; supported: {CONV}, {ATTENTION}")
    return types


@dataclass(frozen=True)
class Mixers(Part):
    """layer_types / full_attn_idxs, conv_L_cache, conv_bias, the heads and norm_eps <-> each layer's mixer.

    A ``conv`` layer is ``short_conv`` (kernel conv_L_cache; conv_bias puts biases on its
    projections and its convolution alike); a ``full_attention`` layer is grouped-query
    attention with head_dim hidden / heads and an RMSNorm (eps norm_eps) per head on queries
    and keys. The commoner kind is the block's, the other kind ``layers:`` overrides.
    """

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        n_layers = cfg.get_layers("num_hidden_layers")
        types = _layer_types(cfg, n_layers)
        conv_bias = cfg.require("conv_bias", (False, True), why="it switches the short convolutions' biases")
        conv = {"kind": "short_conv", "kernel": cfg.get_int("conv_L_cache"), "bias": bool(conv_bias),
                "conv_bias": bool(conv_bias)}
        n_heads = cfg.get_size("num_attention_heads")
        n_kv = cfg.get_size("num_key_value_heads")
        attention = {"kind": "attention", "n_heads": n_heads, "n_kv_heads": n_kv,
                     "head_dim": cfg.get_size("hidden_size") // n_heads,
                     "qk_norm": rmsnorm(cfg, eps_key="norm_eps"), "qk_norm_scope": "head"}
        base, other, other_type = (conv, attention, ATTENTION) if types.count(CONV) >= types.count(ATTENTION) \
            else (attention, conv, CONV)
        model.setdefault("block", {})["mixer"] = base
        others = [i for i, t in enumerate(types) if t == other_type]
        if others:
            model.setdefault("layers", []).append({"select": selection(others, n_layers), "mixer": other})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mixers = view.per_layer("mixer")
        kinds = [m["kind"] for m in mixers]
        for i, kind in enumerate(kinds):
            if kind not in ("short_conv", "attention"):
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{kind!r} has no equivalent in Hugging Face "
                                     f"{view.name} (which has 'short_conv' and 'attention' layers)")
        convs = [m for m in mixers if m["kind"] == "short_conv"]
        attentions = [(i, m) for i, m in enumerate(mixers) if m["kind"] == "attention"]
        if any(c != convs[0] for c in convs[1:]):
            raise NotExpressible("model.layers[*].mixer", f"the short_conv layers differ; Hugging Face {view.name} "
                                 "has one conv_L_cache and conv_bias for all")
        if convs and convs[0]["bias"] != convs[0]["conv_bias"]:
            raise NotExpressible("model.block.mixer.conv_bias", f"Hugging Face {view.name}'s conv_bias switches the "
                                 "projections' biases and the convolution's together (bias and conv_bias must be equal)")
        if any(m != attentions[0][1] for _, m in attentions[1:]):
            raise NotExpressible("model.layers[*].mixer", f"the attention layers differ; Hugging Face {view.name} "
                                 "has one attention setting for all")
        config["layer_types"] = [CONV if kind == "short_conv" else ATTENTION for kind in kinds]
        config["full_attn_idxs"] = [i for i, _ in attentions]
        if convs:
            config.update(conv_L_cache=convs[0]["kernel"], conv_bias=convs[0]["conv_bias"])
        if attentions:
            index, attention = attentions[0]
            n_heads, n_kv, head_dim = view.view.attention_sizes(index)
            if head_dim * n_heads != view.model.d_model:
                raise NotExpressible("model.block.mixer.head_dim", f"Hugging Face {view.name} has head_dim = "
                                     f"d_model / n_heads ({view.model.d_model} / {n_heads})")
            config.update(num_attention_heads=n_heads, num_key_value_heads=n_kv)
        else:
            # No attention layer: the heads size only transformers' unused rotary table; any divisor does.
            config.update(num_attention_heads=1, num_key_value_heads=1)

    def rules(self) -> list[Rule]:
        attention = [
            Fused([f"{SELF_ATTN}.q_proj.weight", f"{SELF_ATTN}.k_proj.weight", f"{SELF_ATTN}.v_proj.weight"],
                  f"{BLOCK_MIXER}.qkv.weight", sizes=qkv_sizes),
            Copy(f"{SELF_ATTN}.out_proj.weight", f"{BLOCK_MIXER}.out.weight"),
            Copy(f"{SELF_ATTN}.q_layernorm.weight", f"{BLOCK_MIXER}.q_norm.weight"),
            Copy(f"{SELF_ATTN}.k_layernorm.weight", f"{BLOCK_MIXER}.k_norm.weight"),
        ]
        conv = [
            Copy(f"{SHORT_CONV}.in_proj.weight", f"{BLOCK_MIXER}.in_proj.weight"),
            Copy(f"{SHORT_CONV}.in_proj.bias", f"{BLOCK_MIXER}.in_proj.bias"),
            DepthwiseConv(f"{SHORT_CONV}.conv.weight", f"{BLOCK_MIXER}.conv_weight"),
            Copy(f"{SHORT_CONV}.conv.bias", f"{BLOCK_MIXER}.conv_bias"),
            Copy(f"{SHORT_CONV}.out_proj.weight", f"{BLOCK_MIXER}.out.weight"),
            Copy(f"{SHORT_CONV}.out_proj.bias", f"{BLOCK_MIXER}.out.bias"),
        ]
        return [OnMixer(r, mixer="attention") for r in attention] + [OnMixer(r, mixer="short_conv") for r in conv]


# -- sizes, norms, feed-forward ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Lfm2Sizes(Sizes):
    """As :class:`Sizes`, with the older tie_embedding (which wins, as in transformers) and ``embedding_norm`` as the final norm."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.update(model_sizes(cfg))
        if cfg.has("tie_embedding"):
            model["tie_embeddings"] = bool(cfg.get("tie_embedding"))

    def rules(self) -> list[Rule]:
        return [Copy("model.embed_tokens.weight", "embedding.weight"),
                Copy("model.embedding_norm.weight", "final_norm.weight"),
                Copy("lm_head.weight", "lm_head.weight")]


@dataclass(frozen=True)
class PreNorm(Part):
    """Pre-norm blocks, their norms named ``operator_norm`` (before the mixer) and ``ffn_norm``."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["layout"] = "prenorm"

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("layout", ("prenorm",))

    def rules(self) -> list[Rule]:
        return [Copy(f"{LAYER}.operator_norm.weight", "blocks.{i}.attention_norm.weight"),
                Copy(f"{LAYER}.ffn_norm.weight", "blocks.{i}.ffn_norm.weight")]


def ffn_width(cfg: ConfigReader) -> int:
    """The SwiGLU width LFM2 builds: intermediate_size (or the older block_ff_dim, which wins), else two thirds
    of it, times block_ffn_dim_multiplier and rounded up to block_multiple_of when a multiplier is set."""
    width = cfg.get_size("block_ff_dim") if cfg.has("block_ff_dim") else cfg.get_size("intermediate_size")
    cfg.mark_read("intermediate_size")
    adjust = cfg.require("block_auto_adjust_ff_dim", (False, True), why="it says whether intermediate_size is adjusted")
    multiplier, multiple = cfg.get("block_ffn_dim_multiplier"), cfg.get_size("block_multiple_of")
    if not adjust:
        return width
    width = int(2 * width / 3)
    if multiplier is not None:
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or multiplier <= 0:
            raise UserError(f"{cfg.family}: block_ffn_dim_multiplier must be a positive number or null, got {multiplier!r}")
        width = int(multiplier * width)
        width = multiple * ((width + multiple - 1) // multiple)
    if width < 1:
        raise UserError(f"{cfg.family}: intermediate_size {cfg.get('intermediate_size')} gives a feed-forward of width {width}")
    return width


@dataclass(frozen=True)
class Lfm2FFN(Part):
    """The SwiGLU feed-forward (``w1`` gate, ``w3`` up, ``w2`` down), its width as :func:`ffn_width` derives it;
    written back as that width with block_auto_adjust_ff_dim off."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model.setdefault("block", {})["ffn"] = {"kind": "swiglu", "hidden": ffn_width(cfg), "activation": "silu"}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("ffn", ("swiglu",))
        if view.uniform("ffn", "activation") != "silu" or view.uniform("ffn", "bias"):
            raise NotExpressible("model.block.ffn", f"Hugging Face {view.name}'s feed-forward is SwiGLU with silu and no biases")
        hidden = view.uniform("ffn", "hidden") or default_gated_hidden(view.model.d_model)
        config.update(intermediate_size=hidden, block_auto_adjust_ff_dim=False)

    def rules(self) -> list[Rule]:
        return [Fused([f"{FFN}.w1.weight", f"{FFN}.w3.weight"], "blocks.{i}.ffn.gate_up.weight", sizes=halves),
                Copy(f"{FFN}.w2.weight", "blocks.{i}.ffn.down.weight")]


FAMILY = decoder_family(
    name="LFM2",
    model_type="lfm2",
    architecture="Lfm2ForCausalLM",
    defaults=DEFAULTS,
    parts=[Lfm2Sizes(), Rope(), PreNorm(), RMSNorm(eps_key="norm_eps"), Mixers(), Lfm2FFN()],
    non_math_fields=LEGACY_FIELDS,
    maps="layer_types (or full_attn_idxs) as short_conv layers (conv_L_cache as kernel, conv_bias) and attention "
         "layers (GQA, RMSNorm per head on q and k) by layers: overrides; pre-norm RMSNorm (norm_eps); rope; SwiGLU "
         "of the width block_auto_adjust_ff_dim, block_ffn_dim_multiplier and block_multiple_of derive",
    caveats="conv_bias switches the short convolutions' projection and convolution biases together; head_dim is "
            "always hidden / heads; export writes the feed-forward width with block_auto_adjust_ff_dim off",
)
