"""MiniMax-Text-01 (``model_type: minimax``): Lightning attention layers among softmax attention ones (``layer_types``),
Mixtral's experts, and DeepNorm-scaled residuals added onto each norm's output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specformer.errors import UserError

from specformer_hf.config import ConfigReader, activation_from_hf
from specformer_hf.parts.attention import Attention, attention_sizes
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, LAYER, FamilyView, Part, Refuse, layers_of_two_kinds
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.deltanet import FULL, LINEAR, hybrid_layer_types, is_full, is_linear
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import MixtureOfExperts
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import Rope
from specformer_hf.rules import AtLayers, Copy, Rule, Site
from specformer_hf.specview import NotExpressible

#: transformers' MiniMaxConfig defaults.
DEFAULTS = {
    "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": None, "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "sliding_window": None, "num_experts_per_tok": 2, "num_local_experts": 8, "router_aux_loss_coef": 0.001,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "layer_types": None, "block_size": 256,
    "full_attn_alpha_factor": 1, "full_attn_beta_factor": 1, "linear_attn_alpha_factor": 1,
    "linear_attn_beta_factor": 1, "mlp_alpha_factor": 1, "mlp_beta_factor": 1,
}

#: Each layer type's residual factors (alpha, beta) around its mixer.
FACTORS = {FULL: ("full_attn_alpha_factor", "full_attn_beta_factor"),
           LINEAR: ("linear_attn_alpha_factor", "linear_attn_beta_factor")}
MLP_FACTORS = ("mlp_alpha_factor", "mlp_beta_factor")
#: The Lightning attention's own norm: transformers builds it with the RMSNorm's default eps, not rms_norm_eps.
LIGHTNING_NORM_EPS = 1e-6


def _minimax_default_types(cfg: ConfigReader, n_layers: int) -> list[str]:
    """MiniMaxConfig without layer_types: even layers (0, 2, ...) softmax attention, odd ones Lightning."""
    return [FULL if (i + 1) % 2 else LINEAR for i in range(n_layers)]


@dataclass(frozen=True)
class MiniMaxMixers(Part):
    """layer_types, the heads, block_size and the six residual factors <-> the mixers and the layouts.

    The block keeps the more common layer type; the other is one ``layers:`` override of mixer
    and layout (the two types' attention factors may differ). Both types share
    num_attention_heads and head_dim; the Lightning attention's q/k/v activation is hidden_act.
    """

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        types = hybrid_layer_types(cfg, _minimax_default_types)
        attention = attention_sizes(cfg)
        lightning = {"kind": "lightning", "n_heads": attention["n_heads"], "head_dim": attention["head_dim"],
                     "activation": activation_from_hf(cfg, "hidden_act"), "norm_eps": LIGHTNING_NORM_EPS,
                     "chunk": cfg.get_size("block_size")}
        mixers = {LINEAR: lightning, FULL: attention}
        mlp = tuple(cfg.get_float(k) for k in MLP_FACTORS)
        layouts = {}
        for kind, (alpha, beta) in FACTORS.items():
            layouts[kind] = {"kind": "prenorm", "normed_residual": True,
                             "residual_scales": [cfg.get_float(alpha), mlp[0]],
                             "output_scales": [cfg.get_float(beta), mlp[1]]}
        layers_of_two_kinds(model, types, {t: {"mixer": mixers[t], "layout": layouts[t]} for t in (LINEAR, FULL)})

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mixers, layouts = view.per_layer("mixer"), view.per_layer("layout")
        by_kind = {"lightning": LINEAR, "attention": FULL}
        types = []
        for i, mixer in enumerate(mixers):
            if mixer["kind"] not in by_kind:
                raise NotExpressible(f"model.layers[{i}].mixer.kind", f"{mixer['kind']!r} has no equivalent in Hugging "
                                     f"Face {view.name} (which uses 'lightning' or 'attention')")
            types.append(by_kind[mixer["kind"]])
        first: dict[str, int] = {}
        for i, (kind, mixer, layout) in enumerate(zip(types, mixers, layouts)):
            j = first.setdefault(kind, i)
            if mixer != mixers[j] or layout != layouts[j]:
                raise NotExpressible(f"model.layers[{i}]", f"mixer or layout differs from layer {j}'s; Hugging Face "
                                     f"{view.name} has one setting for all {kind} layers")
            if not layout.get("normed_residual") or layout.get("residual_multiplier", 1.0) != 1.0:
                raise NotExpressible(f"model.layers[{i}].layout", f"Hugging Face {view.name}'s layers add onto each "
                                     "norm's output (normed_residual: true) with no residual_multiplier")
        heads = {(mixers[j]["n_heads"], mixers[j].get("head_dim") or view.model.d_model // mixers[j]["n_heads"])
                 for j in first.values()}
        if len(heads) > 1:
            raise NotExpressible("model.layers[*].mixer.n_heads", f"Hugging Face {view.name}'s two mixers share "
                                 "num_attention_heads and head_dim")
        (n_heads, head_dim), = heads
        config.update(num_attention_heads=n_heads, head_dim=head_dim, num_key_value_heads=n_heads)
        if FULL in first:
            attention = mixers[first[FULL]]
            config["num_key_value_heads"] = attention.get("n_kv_heads") or n_heads
            for key in ("qkv_bias", "out_bias"):
                if attention.get(key):
                    raise NotExpressible(f"model.block.mixer.{key}", f"Hugging Face {view.name}'s attention has no biases")
        if LINEAR in first:
            lightning = mixers[first[LINEAR]]
            if lightning["norm_eps"] != LIGHTNING_NORM_EPS:
                raise NotExpressible("model.block.mixer.norm_eps", f"{lightning['norm_eps']}: Hugging Face "
                                     f"{view.name}'s Lightning norm always uses {LIGHTNING_NORM_EPS}")
            if lightning["activation"] != config.get("hidden_act", "silu"):
                raise NotExpressible("model.block.mixer.activation", f"Hugging Face {view.name} applies hidden_act "
                                     f"({config.get('hidden_act', 'silu')!r}) to the Lightning attention's q, k, v too")
            config["block_size"] = lightning["chunk"]
        mlp: set[tuple[float, float]] = set()
        for kind, j in first.items():
            alphas, betas = layouts[j]["residual_scales"], layouts[j]["output_scales"]
            config[FACTORS[kind][0]], config[FACTORS[kind][1]] = alphas[0], betas[0]
            mlp.add((alphas[1], betas[1]))
        if len(mlp) > 1:
            raise NotExpressible("model.layers[*].layout.residual_scales", f"Hugging Face {view.name} has one pair "
                                 "of MLP residual factors for all layers")
        (config[MLP_FACTORS[0]], config[MLP_FACTORS[1]]), = mlp
        config["layer_types"] = types


class LightningDecays(Rule):
    """transformers' Lightning decay tables (persistent buffers ``slope_rate``, ``query_decay``, ``key_decay``,
    ``diagonal_decay``): checked against the layer's rates on import, computed as transformers does on export; no
    tensor of ours (the rates follow from the layer's index and the model's depth)."""

    NAMES = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")

    def __init__(self) -> None:
        self.hf, self.ours = tuple(f"{ATTN}.{name}" for name in self.NAMES), ()

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        hf, ours = super().expand_at(site)
        if not is_linear(site):
            # A softmax layer keeps no such tables: a name of ours that no model has makes import and export skip the
            # rule there, as they skip a bias the spec leaves out.
            return hf, (f"blocks.{site.layer}.mixer.decay_tables",)
        return hf, ours

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        stored = tensors[0]
        if not stored.is_meta:  # (meta tensors when only the shapes are checked)
            ours = torch.tensor(site.mixer.decay_rates, dtype=torch.float64)
            if not torch.allclose(stored.double().flatten(), ours, rtol=1e-5, atol=0):
                raise UserError(f"layer {site.layer}: the checkpoint's Lightning slope_rate {stored.flatten().tolist()} "
                                f"is not MiniMax's for layer {site.layer} of {len(site.model.blocks)} "
                                f"({list(site.mixer.decay_rates)})")
        return []

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        # transformers' get_slope_rate and decay_factors, in float32 as it builds them, so the file matches bit for bit.
        heads, chunk, layer, n_layers = site.mixer.n_heads, site.mixer.scan_chunk, site.layer, len(site.model.blocks)
        rate = (1 / (2 ** (8 / heads))) ** (torch.arange(heads) + 1)
        rate = (rate * (1 - layer / (n_layers - 1 + 1e-5) + 1e-5))[:, None, None]  # (H, 1, 1)
        steps = torch.arange(chunk) + 1  # (C,)
        query = torch.exp(-rate * steps[:, None])  # (H, C, 1)
        key = torch.exp(-rate * (chunk - steps[:, None]))  # (H, C, 1)
        diagonal = rate * (steps[:, None] - steps[None, :])[None, None]  # (1, H, C, C)
        diagonal = torch.exp(torch.where(diagonal >= 0, -diagonal, float("-inf")))
        dtype = site.mixer.qkv.weight.dtype
        return [t.to(dtype) for t in (rate, query, key, diagonal)]


def _lightning_rules() -> list[Rule]:
    pairs = (("qkv_proj", "qkv"), ("output_gate", "gate"), ("norm", "norm"), ("out_proj", "out"))
    return [Copy(f"{ATTN}.{hf}.weight", f"{BLOCK_MIXER}.{ours}.weight") for hf, ours in pairs]


_PARTS = (Sizes(), Rope(), Layout("prenorm"), RMSNorm(),
          MixtureOfExperts(n_experts="num_local_experts", saved=f"{LAYER}.block_sparse_moe", gate="w1", up="w3",
                           down="w2"),
          MiniMaxMixers(),
          Refuse("sliding_window", (None,), why="transformers' MiniMax windows its full-attention layers then; "
                 "supported: null (full attention)"))

FAMILY = decoder_family(
    name="MiniMax",
    model_type="minimax",
    architecture="MiniMaxForCausalLM",
    defaults=DEFAULTS,
    parts=_PARTS,
    rules=[*(rule for part in _PARTS for rule in part.rules()),
           *(AtLayers(rule, where=is_full, layers="attention") for rule in Attention().rules()),
           *(AtLayers(rule, where=is_linear, layers="Lightning attention") for rule in _lightning_rules()),
           LightningDecays()],
    non_math_fields=("router_jitter_noise",),
    maps="layer_types (default: even layers full_attention) -> lightning (num_attention_heads, head_dim, hidden_act "
         "as its activation, block_size as chunk; qkv_proj, output_gate, norm, out_proj) or grouped-query attention "
         "in a layers: override; layout prenorm with normed_residual and the *_alpha_factor / *_beta_factor as "
         "residual_scales / output_scales per layer type; ffn moe as Mixtral's; rope",
    caveats="the Lightning norm's eps is 1e-6 (transformers' RMSNorm default, not rms_norm_eps); its decay buffers "
            "(slope_rate, query/key/diagonal_decay) are checked, not read (each layer's rates follow from its index and "
            "num_hidden_layers), and written on export; a sliding_window is refused; router_jitter_noise is training-only; experts read as saved (block_sparse_moe.*) or fused, written per expert",
)
