"""Nemotron-H (``model_type: nemotron_h``, Nemotron-H-8B/47B/56B, Nemotron-Nano-9B-v2): Mamba-2, attention and MLP
layers in one stack.

Each Hugging Face layer is *one* sublayer, pre-normed and added to the residual stream:
a Mamba-2 mixer (``M`` in ``hybrid_override_pattern``, ``linear_attention`` in
``layers_block_type``), attention without positions (``*``, ``full_attention``) or a
squared-ReLU MLP (``-``, ``mlp``). In the spec, layer ``i`` is block ``i``, a ``prenorm``
block with the other sublayer absent (``none``: no weights, and no norm for it):

- ``M``: ``mixer: mamba2``, ``ffn: none`` (the ``block:``, as most layers are Mamba);
- ``*``: ``mixer: {kind: attention, ...}``, ``ffn: none`` (a ``layers:`` override);
- ``-``: ``mixer: none``, ``ffn: {kind: mlp, activation: relu2, ...}`` (an override).

Keeping one block per layer keeps the layer indices, the weight names and the cache's layer
numbers the same as Hugging Face's; pairing a mixer with the MLP after it into one block
would not cover patterns with two mixers in a row (``M*-``). The model has no positions.
Mixture-of-experts layers (``E``) are not supported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import BLOCK_MIXER, FamilyView, Part, selection
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.positions import no_positions
from specformer_hf.parts.mamba2 import Mamba2Fields, mamba2_rules
from specformer_hf.rules import AtLayers, Copy, Fused, Rule, Site, qkv_sizes
from specformer_hf.specview import NotExpressible

#: transformers' NemotronHConfig defaults (layers_block_type: its default when the config names none).
DEFAULTS = {
    "vocab_size": 131072, "hidden_size": 4096, "layers_block_type": None,
    "tie_word_embeddings": False, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 4096, "attention_bias": False, "sliding_window": None, "intermediate_size": 21504,
    "mlp_hidden_act": "relu2", "mlp_bias": False, "ssm_state_size": 128, "mamba_num_heads": 128, "mamba_head_dim": 64,
    "mamba_hidden_act": "silu", "n_groups": 8, "conv_kernel": 4, "expand": 2, "time_step_min": 0.001,
    "time_step_limit": (0.0, math.inf), "use_conv_bias": True, "chunk_size": 128, "use_bias": False,
    "layer_norm_epsilon": 1e-5, "num_nextn_predict_layers": 0,
}
LAYER = "backbone.layers.{i}"
#: hybrid_override_pattern's letters and layers_block_type's names.
LETTERS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
#: Older layers_block_type names, as transformers renames them.
LEGACY = {"mamba": "linear_attention", "attention": "full_attention"}
MIXER = Mamba2Fields(heads="mamba_num_heads", head_dim="mamba_head_dim", state="ssm_state_size", act="mamba_hidden_act",
                     width="heads", step="min")


def layer_types(cfg: ConfigReader) -> list[str]:
    """layers_block_type, else hybrid_override_pattern spelled out (older configs); num_hidden_layers is ignored."""
    cfg.mark_read("num_hidden_layers")  # transformers derives the depth from the layer types
    types = cfg.get("layers_block_type", None)
    pattern = cfg.get("hybrid_override_pattern", None)
    if types is None and pattern is not None:
        if not isinstance(pattern, str) or any(c not in LETTERS for c in pattern):
            raise UserError(f"{cfg.family}: hybrid_override_pattern must be letters of {''.join(LETTERS)}, got {pattern!r}")
        types = [LETTERS[c] for c in pattern]
    if types is None:
        types = ["linear_attention", "moe", "full_attention", "mlp"]  # NemotronHConfig's own default
    if isinstance(types, list):
        types = [LEGACY.get(t, t) if isinstance(t, str) else t for t in types]
    if not isinstance(types, list) or not types or any(t not in LETTERS.values() for t in types):
        raise UserError(f"{cfg.family}: layers_block_type must list {', '.join(LETTERS.values())}, got {types!r}")
    if "moe" in types:
        raise UserError(f"{cfg.family}: mixture-of-experts layers (moe, 'E') are not supported; "
                        "supported: linear_attention (M), full_attention (*), mlp (-)")
    return types


def _attention(cfg: ConfigReader) -> dict[str, Any]:
    if cfg.get("sliding_window", None) is not None:
        raise UserError(f"{cfg.family}: sliding_window {cfg.get('sliding_window')!r} is not supported "
                        "(transformers' Nemotron-H attention reads it only in some kernels)")
    cfg.mark_read("attention_bias")  # transformers' Nemotron-H attention has no biases, whatever it says
    return {"kind": "attention", "n_heads": cfg.get_size("num_attention_heads"),
            "n_kv_heads": cfg.get_size("num_key_value_heads"), "head_dim": cfg.get_size("head_dim")}


def _mlp(cfg: ConfigReader) -> dict[str, Any]:
    cfg.require("mlp_hidden_act", ("relu2",), why="Nemotron-H's MLPs use squared ReLU")
    return {"kind": "mlp", "hidden": cfg.get_size("intermediate_size"), "activation": "relu2",
            "bias": bool(cfg.get("mlp_bias"))}


def _is_mamba(site: Site) -> bool:
    return type(site.mixer).__name__ == "Mamba2"


def _kind_of(layer: dict[str, Any]) -> str | None:
    """A spec layer's Hugging Face layer type, or None when it is none of them."""
    return {("mamba2", "none"): "linear_attention", ("attention", "none"): "full_attention",
            ("none", "mlp"): "mlp"}.get((layer["mixer"]["kind"], layer["ffn"]["kind"]))


def _uniform(view: FamilyView, indices: list[int], field: str, what: str) -> dict[str, Any]:
    """The ``field`` of the layers ``indices``, which must be the same in all of them."""
    parts = [view.view.layers[i][field] for i in indices]
    if any(p != parts[0] for p in parts[1:]):
        raise NotExpressible(f"model.layers[*].{field}", f"the {what} layers differ; Hugging Face {view.name} "
                             f"has one setting for all of them")
    return parts[0]


@dataclass(frozen=True)
class NemotronHModel(Part):
    """The whole model: sizes, the layer types, and each type's sublayer (see the module's docstring)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        types = layer_types(cfg)
        n_layers = len(types)
        cfg.mark_read("tie_word_embeddings")  # transformers' Nemotron-H never ties its head, whatever it says
        model.update(
            vocab_size=cfg.get_int("vocab_size"), d_model=cfg.get_size("hidden_size"), n_layers=n_layers,
            context_length=cfg.get_size("max_position_embeddings"), tie_embeddings=False,
            positional={"kind": "none"},
            block={"layout": "prenorm", "norm": {"kind": "rmsnorm", "eps": cfg.get_float("layer_norm_epsilon")},
                   "mixer": MIXER.spec(cfg), "ffn": "none"},
        )
        layers = []
        attention = [i for i, t in enumerate(types) if t == "full_attention"]
        mlp = [i for i, t in enumerate(types) if t == "mlp"]
        # Read whether the model has such layers or not: a field of an absent layer type changes nothing.
        attention_spec, mlp_spec = _attention(cfg), _mlp(cfg)
        if attention:
            layers.append({"select": selection(attention, n_layers), "mixer": attention_spec})
        if mlp:
            layers.append({"select": selection(mlp, n_layers), "mixer": "none", "ffn": mlp_spec})
        if layers:
            model["layers"] = layers
        if cfg.get_int("num_nextn_predict_layers"):
            cfg.note_unused("num_nextn_predict_layers (the multi-token prediction layers are not imported)")

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        m = view.model
        if m.lm_head_bias:
            raise NotExpressible("model.lm_head_bias", f"Hugging Face {view.name} has no LM head bias")
        if m.tie_embeddings:
            raise NotExpressible("model.tie_embeddings", f"Hugging Face {view.name} never ties its LM head to the embeddings")
        no_positions(view)
        view.block_kind("layout", ("prenorm",))
        view.block_kind("norm", ("rmsnorm",))
        types = [_kind_of(layer) for layer in view.view.layers]
        for i, t in enumerate(types):
            if t is None:
                layer = view.view.layers[i]
                raise NotExpressible(f"model.layers[{i}]", f"attention {layer['mixer']['kind']!r} with ffn "
                                     f"{layer['ffn']['kind']!r}; Hugging Face {view.name}'s layers are mamba2 with ffn "
                                     "none, attention with ffn none, or attention none with an mlp")
        config.update(vocab_size=m.vocab_size, hidden_size=m.d_model, num_hidden_layers=m.n_layers,
                      max_position_embeddings=m.context_length, tie_word_embeddings=False,
                      layer_norm_epsilon=view.uniform("norm", "eps"), layers_block_type=types,
                      hybrid_override_pattern="".join(next(c for c, n in LETTERS.items() if n == t) for t in types))
        by_type = {t: [i for i, x in enumerate(types) if x == t] for t in LETTERS.values()}
        if by_type["linear_attention"]:
            mixer = _uniform(view, by_type["linear_attention"], "mixer", "mamba2")
            config.update(MIXER.config(mixer, d_model=m.d_model, family=view.name))
        if by_type["full_attention"]:
            attention = _uniform(view, by_type["full_attention"], "mixer", "attention")
            if attention["qkv_bias"] or attention["out_bias"]:
                raise NotExpressible("model.layers[*].mixer", f"Hugging Face {view.name}'s attention has no biases")
            n_heads, n_kv, head_dim = view.view.attention_sizes(by_type["full_attention"][0])
            config.update(num_attention_heads=n_heads, num_key_value_heads=n_kv, head_dim=head_dim,
                          attention_bias=False)
        if by_type["mlp"]:
            mlp = _uniform(view, by_type["mlp"], "ffn", "mlp")
            if mlp["activation"] != "relu2" or mlp["hidden"] is None:
                raise NotExpressible("model.layers[*].ffn", f"Hugging Face {view.name}'s MLPs are relu2 with a "
                                     "stated hidden width")
            config.update(intermediate_size=mlp["hidden"], mlp_hidden_act="relu2", mlp_bias=mlp["bias"])

    def rules(self) -> list[Rule]:
        attn = mlp = f"{LAYER}.mixer"  # every layer's one sublayer is its "mixer"
        mamba_out = {r.ours: r for r in mamba2_rules(f"{LAYER}.mixer", BLOCK_MIXER) if r.ours[0].startswith(f"{BLOCK_MIXER}.out.")}
        return [
            Copy("backbone.embeddings.weight", "embedding.weight"),
            Copy("backbone.norm_f.weight", "final_norm.weight"),
            Copy("lm_head.weight", "lm_head.weight"),
            # One norm per layer: the mixer's in Mamba and attention layers, the MLP's in MLP layers
            # (a rule whose parameter a layer lacks is skipped there).
            Copy(f"{LAYER}.norm.weight", "blocks.{i}.attention_norm.weight"),
            Copy(f"{LAYER}.norm.weight", "blocks.{i}.ffn_norm.weight"),
            *(r for r in mamba2_rules(f"{LAYER}.mixer", BLOCK_MIXER) if r.ours not in mamba_out),
            Fused([f"{attn}.q_proj.weight", f"{attn}.k_proj.weight", f"{attn}.v_proj.weight"],
                  f"{BLOCK_MIXER}.qkv.weight", sizes=qkv_sizes),
            # Mamba and attention layers both have mixer.out, from different tensors.
            AtLayers(mamba_out[(f"{BLOCK_MIXER}.out.weight",)], where=_is_mamba, layers="Mamba"),
            AtLayers(Copy(f"{attn}.o_proj.weight", f"{BLOCK_MIXER}.out.weight"),
                     where=lambda site: not _is_mamba(site), layers="attention"),
            mamba_out[(f"{BLOCK_MIXER}.out.bias",)],  # attention layers have no output bias
            Copy(f"{mlp}.up_proj.weight", "blocks.{i}.ffn.fc_in.weight"),
            Copy(f"{mlp}.up_proj.bias", "blocks.{i}.ffn.fc_in.bias"),
            Copy(f"{mlp}.down_proj.weight", "blocks.{i}.ffn.fc_out.weight"),
            Copy(f"{mlp}.down_proj.bias", "blocks.{i}.ffn.fc_out.bias"),
        ]


FAMILY = decoder_family(
    name="Nemotron-H",
    model_type="nemotron_h",
    architecture="NemotronHForCausalLM",
    defaults=DEFAULTS,
    parts=[NemotronHModel()],
    # Checkpoints name the base model "backbone" (transformers 5 too, though it is "model" in memory).
    aliases=(("backbone.", "model."),),
    # Initialisation only, or read by no layer transformers builds (mamba_proj_bias: the projections follow use_bias;
    # the MoE fields: only moe layers, which are refused).
    non_math_fields=("time_step_max", "time_step_floor", "rescale_prenorm_residual", "residual_in_fp32",
                     "mamba_proj_bias", "mamba_ssm_cache_dtype", "use_mamba_kernels", "num_logits_to_keep",
                     "n_routed_experts", "n_shared_experts", "moe_intermediate_size",
                     "moe_shared_expert_intermediate_size", "moe_latent_size", "moe_shared_expert_overlap",
                     "num_experts_per_tok", "routed_scaling_factor", "n_group", "topk_group", "norm_topk_prob",
                     "mtp_layers_block_type", "mtp_hybrid_override_pattern"),
    maps="layers_block_type / hybrid_override_pattern -> one prenorm block per layer: M -> mamba2 with ffn none, "
         "* -> attention (no positions, no biases) with ffn none, - -> attention none with a relu2 mlp; mamba_num_heads, "
         "mamba_head_dim, ssm_state_size, n_groups, conv_kernel, use_conv_bias, use_bias, time_step_min -> dt_min, "
         "chunk_size",
    caveats="mixture-of-experts layers (E) and the multi-token prediction layers are not supported; "
            "tie_word_embeddings and attention_bias are not read (transformers ignores them); "
            "residual_in_fp32 is not reproduced",
)
