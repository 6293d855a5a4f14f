"""A.X-K2 (``model_type: axk2``, SK Telecom's skt/A.X-K2): DeepSeek-V3.2 (latent attention whose keys a lightning
indexer picks, sigmoid-routed experts with a shared expert after dense first layers) with gated norms and a gated,
fused query.

Every layer's attention norm and the MoE layers' FFN norm are RMSNorms times a low-rank sigmoid gate
(``AXK2GatedRMSNorm``: norm ``gated`` with ``rank`` gated_norm_rank; its ``norm`` and ``mlp.fc1``/``mlp.fc2``
are ours ``norm``, ``down``, ``up``); the dense layers' FFN norm is a plain RMSNorm (layout ``prenorm`` with
``ffn_norm`` on those layers). The attention has no ``q_b_proj``: ``q_gate_proj`` reads ``[norm(a); a]`` for the
query latent ``a`` and holds, head by head, the query's rows then an output gate's (one sigmoid per value channel):
``q_up_input: normed_and_raw``, ``output_gate`` with ``output_gate_scope: channel`` and ``output_gate_input:
query_latent`` (ours ``q_b`` and ``gate``). Routing has no expert groups unless ``n_group`` is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specformer_hf.config import ConfigReader
from specformer_hf.families.axk1 import MlpLayerTypedExperts
from specformer_hf.families.deepseek_v32 import IndexedLatentAttention, PairedRope
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, LAYER, FamilyView, Part
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.rules import AtLayers, Copy, OneOf, Rule, Site
from specformer_hf.specview import NotExpressible

#: transformers' AXK2Config defaults (its docstring names skt/A.X-K2; the values are A.X-K2-Light's).
DEFAULTS = {
    "vocab_size": 163840, "hidden_size": 2048, "intermediate_size": 5120, "moe_intermediate_size": 512,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 32, "n_shared_experts": 1,
    "n_routed_experts": 128, "routed_scaling_factor": 2.5, "kv_lora_rank": 128, "q_lora_rank": 384,
    "qk_rope_head_dim": 32, "v_head_dim": 64, "qk_nope_head_dim": 64, "n_group": None, "topk_group": None,
    "num_experts_per_tok": 8, "norm_topk_prob": True, "hidden_act": "silu", "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "mlp_layer_types": None,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "attention_bias": False, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 16, "head_dim": 64,
    "layer_types": None, "gated_norm_rank": 16,
}

#: What A.X-K2's attention sets on latent attention beside DeepSeek-V3.2's.
GATED_QUERY = {"q_up_input": "normed_and_raw", "output_gate": True, "output_gate_scope": "channel",
               "output_gate_input": "query_latent"}


class QueryGateRows(Rule):
    """``q_gate_proj`` rows, head by head ``[query (qk_head_dim); gate (v_head_dim)]``, as ours ``q_b`` and ``gate``."""

    def __init__(self, hf: str) -> None:
        self.hf = (f"{ATTN}.{hf}.weight",)
        self.ours = (f"{BLOCK_MIXER}.q_b.weight", f"{BLOCK_MIXER}.gate.weight")

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        a, t = site.mixer, tensors[0]
        rows = t.reshape(a.n_heads, a.qk_head_dim + a.v_head_dim, t.shape[1])  # (H, qk + vd, 2 q_lora_rank)
        query, gate = rows.split((a.qk_head_dim, a.v_head_dim), dim=1)
        return [query.reshape(-1, t.shape[1]).contiguous(), gate.reshape(-1, t.shape[1]).contiguous()]

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        a, (query, gate) = site.mixer, tensors
        width = query.shape[1]
        rows = torch.cat((query.reshape(a.n_heads, a.qk_head_dim, width), gate.reshape(a.n_heads, a.v_head_dim, width)),
                         dim=1)  # (H, qk + vd, 2 q_lora_rank)
        return [rows.reshape(-1, width).contiguous()]


@dataclass(frozen=True)
class GatedQueryAttention(IndexedLatentAttention):
    """DeepSeek-V3.2's indexed latent attention whose query and channel gate come from one ``q_gate_proj`` reading
    ``[norm(a); a]`` (no q_b_proj)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        model["block"]["mixer"].update(GATED_QUERY)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mixer = view.uniform("mixer")
        for key, value in GATED_QUERY.items():
            if mixer.get(key) != value:
                raise NotExpressible(f"model.block.mixer.{key}", f"Hugging Face {view.name}'s attention computes its "
                                     "queries and a sigmoid gate per value channel from [norm(a); a] "
                                     f"({', '.join(f'{k}: {v}' for k, v in GATED_QUERY.items())})")
        super().write(view, config)

    def rules(self) -> list[Rule]:
        # No q_proj or q_b_proj: q_gate_proj fills q_b and the gate.
        rules = [r for r in super().rules() if not any(".q_b_proj." in n or ".q_proj." in n for n in r.hf)]
        # save_pretrained writes the fused projection as q_b_proj (the released checkpoints' name, which transformers
        # renames on load); a file saved from the module as it is names it q_gate_proj.
        return [*rules, OneOf(QueryGateRows("q_b_proj"), QueryGateRows("q_gate_proj"))]


def _gated_ffn_norm(site: Site) -> bool:
    return hasattr(site.model.blocks[site.layer].ffn_norm, "up")


@dataclass(frozen=True)
class GatedNorms(Part):
    """rms_norm_eps, gated_norm_rank <-> prenorm blocks with norm ``gated`` (an RMSNorm and a silu gate of that rank),
    ``ffn_norm: rmsnorm`` on the dense layers, and a plain RMSNorm as the final norm. Comes after the experts (their
    dense-layer overrides get the layout)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        rms = {"kind": "rmsnorm", "eps": cfg.get_float("rms_norm_eps")}
        block = model.setdefault("block", {})
        block["layout"] = "prenorm"
        block["norm"] = {"kind": "gated", "norm": dict(rms), "rank": cfg.get_size("gated_norm_rank"), "activation": "silu"}
        model["final_norm"] = dict(rms)
        for layer in model.get("layers", []):
            if layer.get("ffn", {}).get("kind") != "moe":  # the dense layers (the experts' overrides)
                layer["layout"] = {"kind": "prenorm", "ffn_norm": dict(rms)}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("layout", ("prenorm",))
        view.block_kind("norm", ("gated",))
        norm = view.uniform("norm")
        inner = norm["norm"]
        plain = {"kind": "rmsnorm", "eps": inner.get("eps"), "offset": 0.0, "weight": True}
        if {**plain, **inner} != plain or norm["activation"] != "silu":
            raise NotExpressible("model.block.norm", f"Hugging Face {view.name}'s block norms are RMSNorms gated "
                                 "through a silu bottleneck ({kind: gated, norm: {kind: rmsnorm}, activation: silu})")
        if {**plain, **view.view.final_norm} != plain:
            raise NotExpressible("model.final_norm", f"Hugging Face {view.name}'s final norm is an RMSNorm of the "
                                 f"blocks' eps ({{kind: rmsnorm, eps: {inner.get('eps')}}})")
        for i, layer in enumerate(view.view.layers):
            layout, moe = layer["layout"], layer["ffn"]["kind"] == "moe"
            own = layout.get("ffn_norm")
            if moe != (own is None) or (own is not None and {**plain, **own} != plain) or not layout.get(
                    "mixer_pre_norm", True) or layout.get("normed_residual") or layout.get("residual_multiplier", 1.0) != 1.0:
                raise NotExpressible(f"model.layers[{i}].layout", f"Hugging Face {view.name} gates the FFN norm of "
                                     "its moe layers and not of its dense ones (prenorm, ffn_norm: rmsnorm of the "
                                     "blocks' eps on the dense layers only)")
        config.update(rms_norm_eps=inner["eps"], gated_norm_rank=norm["rank"])

    def rules(self) -> list[Rule]:
        # The gate's projections are saved as W_down / W_up (transformers renames them to mlp.fc1 / mlp.fc2 on load
        # and back on save); either is read, the saved names written.
        gated = [(("norm.weight",), "norm.weight"), (("W_down.weight", "mlp.fc1.weight"), "down.weight"),
                 (("W_up.weight", "mlp.fc2.weight"), "up.weight")]

        def one(norm: str, hf: tuple[str, ...], ours: str) -> Rule:
            copies = [Copy(f"{LAYER}.{norm}.{name}", f"blocks.{{i}}.{ours}") for name in hf]
            return copies[0] if len(copies) == 1 else OneOf(*copies)

        rules: list[Rule] = [one("input_layernorm", hf, f"attention_norm.{ours}") for hf, ours in gated]
        rules += [AtLayers(one("post_attention_layernorm", hf, f"ffn_norm.{ours}"), where=_gated_ffn_norm,
                           layers="moe") for hf, ours in gated]
        return [*rules, AtLayers(Copy(f"{LAYER}.post_attention_layernorm.weight", "blocks.{i}.ffn_norm.weight"),
                                 where=lambda site: not _gated_ffn_norm(site), layers="dense")]


@dataclass(frozen=True)
class UngroupedExperts(MlpLayerTypedExperts):
    """A.X-K2's experts: groups only when n_group is given (None, the default, routes over every expert)."""

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        if config["n_group"] == 1 and config["topk_group"] == 1:
            config.update(n_group=None, topk_group=None)


FAMILY = decoder_family(
    name="A.X-K2",
    model_type="axk2",
    architecture="AXK2ForCausalLM",
    defaults=DEFAULTS,
    parts=(Sizes(), PairedRope(), GatedQueryAttention(), UngroupedExperts(), GatedNorms()),
    maps="as DeepSeek-V3.2 (attention mla with a lightning indexer: index_topk, index_n_heads, index_head_dim; "
         "interleaved rope; ffn moe with router sigmoid_topk, n_group/topk_group when set, n_shared_experts; "
         "mlp_layer_types -> dense first layers); q_gate_proj -> mla q_b and a channel output gate read from "
         "[norm(a); a] (q_up_input normed_and_raw, output_gate_scope channel, output_gate_input query_latent); "
         "AXK2GatedRMSNorm -> norm gated (rmsnorm, rank gated_norm_rank, silu) on the attention norms and the moe "
         "layers' FFN norms, ffn_norm rmsnorm on the dense layers",
    caveats="dense layers must come first in mlp_layer_types; aux_loss_coef is 0 on import; the indexer learns only "
            "from its own loss, and ties of the index score at a query's cut go to the keys torch.topk returns "
            "(indexer.ties: topk), as in DeepSeek-V3.2",
)
