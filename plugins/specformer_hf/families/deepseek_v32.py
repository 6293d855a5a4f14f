"""DeepSeek-V3.2 (``model_type: deepseek_v32``): DeepSeek-V3 whose latent attention reads only the keys a lightning
indexer picks for each query (DeepSeek Sparse Attention)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError
from specformer_hf.config import ConfigReader
from specformer_hf.parts.attention import LatentAttention
from specformer_hf.parts.base import ATTN, BLOCK_MIXER, FamilyView, Part
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.feedforward import GroupedExperts
from specformer_hf.parts.mtp import LayerMTP
from specformer_hf.parts.norms import Layout, RMSNorm
from specformer_hf.parts.positions import rope, rope_parameters_of
from specformer_hf.families.deepseek_v3 import DEFAULTS as V3_DEFAULTS
from specformer_hf.rules import Copy, Rule
from specformer_hf.specview import NotExpressible

#: transformers' DeepseekV32Config defaults (DeepSeek-V3's, less rope_interleave and the MTP count, plus the indexer's).
DEFAULTS = {
    **{k: v for k, v in V3_DEFAULTS.items() if k not in ("rope_interleave", "num_mtp_layers")},
    "max_position_embeddings": 163840, "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64,
    "mlp_layer_types": None, "layer_types": None, "mlp_bias": False,
}
#: The indexer's key norm: transformers' DeepseekV32Indexer.k_norm, nn.LayerNorm(index_head_dim, eps=1e-6).
KEY_NORM = {"kind": "layernorm", "eps": 1e-6, "bias": True, "affine": True, "offset": 0.0}


@dataclass(frozen=True)
class PairedRope(Part):
    """rope_parameters <-> the rope of the latent attention, whose rotary channels always turn in adjacent pairs
    (DeepSeek-V3.2 has no rope_interleave: its attention is interleaved, its indexer turns halves)."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        model["positional"] = {**rope(cfg), "interleaved": True}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.view.one_positional(family=view.name)
        pos = dict(view.positional)
        if not pos.pop("interleaved", False):
            raise NotExpressible("model.positional.interleaved", f"Hugging Face {view.name}'s latent attention turns "
                                 "its rotary channels in adjacent pairs (interleaved: true)")
        config["rope_parameters"] = rope_parameters_of({**pos, "interleaved": False}, view.name, path="model.positional",
                                                       context_length=view.model.context_length)


@dataclass(frozen=True)
class IndexedLatentAttention(LatentAttention):
    """DeepSeek-V3's latent attention fields, and index_topk, index_n_heads, index_head_dim <-> its ``lightning``
    indexer (wq_b reading the query latent, wk, the k_norm LayerNorm, weights_proj); every layer_types entry is
    indexed_attention."""

    indexed: bool = True
    #: The indexer turns its rotary channels in adjacent pairs (GLM-5's); DeepSeek-V3.2's turns halves.
    indexer_interleaved: bool = False

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        super().read(cfg, model)
        attention = model["block"]["mixer"]
        if attention["q_lora_rank"] is None:
            raise UserError(f"{cfg.family}: q_lora_rank must be set: the indexer reads the query latent")
        types = cfg.get("layer_types") or []
        if any(t != "indexed_attention" for t in types):
            raise UserError(f"{cfg.family}: layer_types {sorted(set(types))} are not supported: every layer of "
                            "DeepSeek-V3.2 is indexed_attention")
        attention["indexer"] = {"kind": "lightning", "topk": cfg.get_size("index_topk"),
                                "n_heads": cfg.get_size("index_n_heads"), "head_dim": cfg.get_size("index_head_dim"),
                                "key_norm": dict(KEY_NORM), "interleaved": self.indexer_interleaved,
                                # transformers keeps what torch.topk returns when scores tie at the cut
                                "ties": "topk"}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        indexer = view.uniform("mixer")["indexer"]
        if (indexer["kind"] != "lightning" or indexer["interleaved"] != self.indexer_interleaved
                or {**KEY_NORM, **indexer["key_norm"]} != KEY_NORM):
            turns = "in adjacent pairs (interleaved: true)" if self.indexer_interleaved else "in halves"
            raise NotExpressible("model.block.mixer.indexer", f"Hugging Face {view.name}'s indexer is lightning, "
                                 f"turns its rotary channels {turns} and normalises keys by a LayerNorm (eps 1e-6)")
        if view.uniform("mixer")["q_lora_rank"] is None:
            raise NotExpressible("model.block.mixer.q_lora_rank", f"Hugging Face {view.name} needs a query latent")
        config.update(index_topk=indexer["topk"], index_n_heads=indexer["n_heads"], index_head_dim=indexer["head_dim"])

    def rules(self) -> list[Rule]:
        pairs = [("wq_b.weight", "q_proj.weight"), ("wk.weight", "k_proj.weight"), ("k_norm.weight", "k_norm.weight"),
                 ("k_norm.bias", "k_norm.bias"), ("weights_proj.weight", "weights_proj.weight")]
        return super().rules() + [Copy(f"{ATTN}.indexer.{hf}", f"{BLOCK_MIXER}.indexer.{ours}")
                                  for hf, ours in pairs]


@dataclass(frozen=True)
class LayerTypedExperts(GroupedExperts):
    """DeepSeek-V3's experts, with mlp_layer_types (dense layers first, then sparse) beside first_k_dense_replace."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        types = cfg.get("mlp_layer_types")
        # transformers' MLP ignores mlp_bias (its projections have no bias), so the field changes nothing.
        cfg.mark_read("mlp_bias")
        if types is not None:
            dense = next((i for i, t in enumerate(types) if t != "dense"), len(types))
            if len(types) != cfg.get_layers("num_hidden_layers") or any(t != "sparse" for t in types[dense:]):
                raise UserError(f"{cfg.family}: mlp_layer_types must name every layer, dense ones first, then sparse "
                                f"ones; got {types}")
            # transformers builds the layers from mlp_layer_types (first_k_dense_replace only fills it in).
            cfg.data["first_k_dense_replace"] = dense
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        n = view.model.n_layers
        dense = config["first_k_dense_replace"]
        config["mlp_layer_types"] = ["dense"] * dense + ["sparse"] * (n - dense)


FAMILY = decoder_family(
    name="DeepSeek-V3.2",
    model_type="deepseek_v32",
    architecture="DeepseekV32ForCausalLM",
    defaults=DEFAULTS,
    parts=[Sizes(), PairedRope(), Layout("prenorm"), RMSNorm(), IndexedLatentAttention(), LayerTypedExperts(),
           LayerMTP()],
    maps="DeepSeek-V3's mapping (attention mla, interleaved rope, ffn moe with sigmoid_topk, dense first layers from "
         "mlp_layer_types / first_k_dense_replace) and the indexer: index_topk, index_n_heads, index_head_dim <-> "
         "mixer.indexer lightning (wq_b, wk, k_norm, weights_proj); num_nextn_predict_layers -> mtp depths as DeepSeek-V3's",
    caveats="a file without the multi-token-prediction layers its config counts imports without model.mtp, with a "
            "note; aux_loss_coef is 0 on import; transformers' indexer never learns (no gradient reaches it), "
            "here it learns from its own KL loss when training (mixer.indexer.loss_coef, 0 turns it off); ties "
            "of the index score at a query's cut go to the keys torch.topk returns over the same row, as transformers "
            "(indexer.ties: topk), so at a tie a cached step may choose otherwise than recomputing, in both",
    ignore_tensors=(r"model\.layers\.61\..*",),
)
