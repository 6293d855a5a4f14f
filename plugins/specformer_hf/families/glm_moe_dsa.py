"""GLM-MoE-DSA (``model_type: glm_moe_dsa``, zai-org/GLM-5): DeepSeek-V3.2's sparse latent attention and experts with
GLM-5's sizes, its lightning indexer turning adjacent pairs of rotary channels.

transformers' GLM-MoE-DSA is DeepSeek-V3.2 (latent attention reading the keys a lightning indexer
picks, DeepSeek-V3's sigmoid-routed experts after dense first layers) with two changes: the
indexer rotates its queries and keys as the attention does (interleaved, not in halves), and
``indexer_types`` may make a layer reuse the keys the last ``full`` layer's indexer chose
(``shared``). Every layer with an indexer of its own is mapped; a ``shared`` layer is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.families.deepseek_v32 import DEFAULTS as V32_DEFAULTS, IndexedLatentAttention, LayerTypedExperts, \
    PairedRope
from specformer_hf.parts.base import FamilyView
from specformer_hf.parts.decoder import decoder_family
from specformer_hf.parts.embedding import Sizes
from specformer_hf.parts.mtp import LayerMTP
from specformer_hf.parts.norms import Layout, RMSNorm

#: transformers' GlmMoeDsaConfig defaults (its docstring names zai-org/GLM-5): DeepseekV32Config's with GLM-5's sizes.
DEFAULTS = {
    **V32_DEFAULTS, "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288, "num_hidden_layers": 78,
    "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 2048, "qk_nope_head_dim": 192,
    "v_head_dim": 256, "n_group": 1, "topk_group": 1, "max_position_embeddings": 202752, "rms_norm_eps": 1e-5,
    "index_n_heads": 32, "indexer_types": None,
}

#: The config.json keywords transformers turns into indexer_types when a config has none.
PATTERN_KEYS = ("index_topk_pattern", "index_topk_freq", "index_skip_topk_offset")


def indexer_types(cfg: ConfigReader, n_layers: int) -> list[str]:
    """indexer_types, else what GlmMoeDsaConfig derives from index_topk_pattern, else from index_topk_freq and
    index_skip_topk_offset (default: every layer ``full``)."""
    types = cfg.get("indexer_types")
    pattern = cfg.data.get("index_topk_pattern")
    cfg.mark_read(*PATTERN_KEYS)  # indexer_types, when present, is what transformers reads
    if types is None and pattern is not None:
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern] if isinstance(pattern, str) else pattern
    elif types is None:
        freq, offset = cfg.data.get("index_topk_freq", 1), cfg.data.get("index_skip_topk_offset", 2)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (freq, offset)):
            raise UserError(f"{cfg.family}: index_topk_freq and index_skip_topk_offset must be integers, got "
                            f"{freq!r} and {offset!r}")
        freq = max(freq, 1)
        types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n_layers)]
    if not isinstance(types, list) or len(types) != n_layers:
        raise UserError(f"{cfg.family}: indexer_types must name one indexer mode for each of the {n_layers} layers, "
                        f"got {types!r}")
    return list(types)


@dataclass(frozen=True)
class OwnIndexers(IndexedLatentAttention):
    """DeepSeek-V3.2's indexed latent attention, its indexer interleaved, every layer's ``indexer_types`` ``full``."""

    indexer_interleaved: bool = True

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        types = indexer_types(cfg, cfg.get_layers("num_hidden_layers"))
        shared = [i for i, t in enumerate(types) if t != "full"]
        if shared:
            raise UserError(f"{cfg.family}: indexer_types makes layers {shared} reuse an earlier layer's chosen keys "
                            f"({sorted({types[i] for i in shared})}); specformer lacks cross-layer top-k sharing "
                            "(issue 47): every layer must be 'full'")
        super().read(cfg, model)

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        super().write(view, config)
        config["indexer_types"] = ["full"] * view.model.n_layers


FAMILY = decoder_family(
    name="GLM-MoE-DSA",
    model_type="glm_moe_dsa",
    architecture="GlmMoeDsaForCausalLM",
    defaults=DEFAULTS,
    parts=[Sizes(), PairedRope(), Layout("prenorm"), RMSNorm(), OwnIndexers(), LayerTypedExperts(), LayerMTP()],
    maps="DeepSeek-V3.2's mapping (attention mla with the lightning indexer, interleaved rope, ffn moe with "
         "sigmoid_topk, dense first layers from mlp_layer_types / first_k_dense_replace) with the indexer's rope "
         "interleaved; indexer_types (or index_topk_pattern, index_topk_freq, index_skip_topk_offset) all 'full'; num_nextn_predict_layers -> mtp depths as DeepSeek-V3's "
         "(model.layers.78: enorm, hnorm, eh_proj, shared_head.norm and a decoder layer with its own indexer)",
    caveats="'shared' indexer layers (reusing an earlier layer's chosen keys) are refused; a file without the "
            "multi-token-prediction layers its config counts imports without model.mtp, with a note; aux_loss_coef is 0 on import; index ties go to the keys torch.topk returns, as in DeepSeek-V3.2",
    ignore_tensors=(r"model\.layers\.78\..*",),
)
