"""Multi-token prediction depths as DeepSeek-V3's published checkpoints keep them (``model.mtp``).

DeepSeek-V3, DeepSeek-V3.2 and GLM-4.5 store depth k (1-based) as one more decoder layer after
the last, ``model.layers.{N + k - 1}`` (N = num_hidden_layers): the usual tensors of a decoder
layer of the last layer's kind (its attention, its experts and norms), plus ``enorm``, ``hnorm``,
``eh_proj`` and ``shared_head.norm``, and copies of the shared embedding (``embed_tokens``) and
head (``shared_head.head``). ``num_nextn_predict_layers`` (transformers: ``num_mtp_layers``)
counts the depths. transformers builds no MTP module for its causal LM and skips these tensors;
its own ``save_pretrained`` leaves them out while still writing the count, so import reads the
depths only from a file that has them (the importer drops ``model.mtp`` and says so otherwise).

The per-layer rules of the family fill each depth's block: they are applied at checkpoint layer
``N + k - 1`` with our names under ``mtp.{k-1}.block`` (:func:`~specformer_hf.rules.sites_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import Tensor

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import LAYER, FamilyView, Part
from specformer_hf.parts.deltanet import AttentionFields
from specformer_hf.rules import Copy, Rule, Site
from specformer_hf.specview import NotExpressible

#: The config field of the published checkpoints (transformers reads it as num_mtp_layers).
PUBLISHED_COUNT = "num_nextn_predict_layers"


class SharedCopy(Rule):
    """A depth's copy of a parameter the depths share with the main model (the embedding, the head).

    Import reads it as that parameter again (the importer refuses a copy that differs from the
    main tensor); export writes the main tensor under the depth's name too, as the published
    checkpoints do (inference engines that load the depth alone read it there). ``ours(site)``
    names the parameter (the head's is the embedding when they are tied).
    """

    def __init__(self, hf: str, ours: Callable[[Site], str]) -> None:
        self.hf, self.ours = (hf,), ("{d}",)  # ``{d}``: one per depth; the name itself comes from ``ours(site)``
        self._ours = ours

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (site.hf_name(self.hf[0]),), (self._ours(site),)

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return list(tensors)

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        return [tensors[0].clone()]

    def describe(self) -> str:
        return f"{self.hf[0]} (a copy of the shared one)"


def _head(site: Site) -> str:
    return "embedding.weight" if site.model.lm_head is None else "lm_head.weight"


@dataclass(frozen=True)
class LayerMTP(Part):
    """num_nextn_predict_layers (or num_mtp_layers) <-> ``model.mtp.depths``, each depth kept as a decoder layer after
    the last (DeepSeek-V3's layout): its block is the model's block (the experts' layer, as the published MTP layers
    are), its norms the block's RMSNorm and the final norm.

    ``final_norm``: the depth's own name of its norm before the head (Hunyuan 3: ``final_layernorm``);
    ``copies``: whether the checkpoints keep copies of the embedding and head in each depth (Hunyuan 3's
    loaders read none: they share the main model's).
    """

    final_norm: str = "shared_head.norm"
    copies: bool = True

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        count = cfg.get_int(PUBLISHED_COUNT) if cfg.has(PUBLISHED_COUNT) else cfg.get_int("num_mtp_layers", 0)
        cfg.mark_read(PUBLISHED_COUNT, "num_mtp_layers")
        if count:
            model["mtp"] = {"depths": count}

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mtp = view.model.mtp
        if mtp is not None and (mtp.block.model_dump(exclude_none=True) or mtp.input_norm is not None
                                or mtp.final_norm is not None):
            raise NotExpressible("model.mtp", f"Hugging Face {view.name}'s MTP layers run the model's block (its "
                                 "experts' layer), with its RMSNorm on both inputs and the final norm before the head")
        config[PUBLISHED_COUNT] = mtp.depths if mtp is not None else 0

    def rules(self) -> list[Rule]:
        at = f"{LAYER}"  # model.layers.{i}, i = N + depth
        own: list[Rule] = [
            Copy(f"{at}.enorm.weight", "mtp.{d}.enorm.weight"),
            Copy(f"{at}.hnorm.weight", "mtp.{d}.hnorm.weight"),
            Copy(f"{at}.eh_proj.weight", "mtp.{d}.eh_proj.weight"),
            Copy(f"{at}.{self.final_norm}.weight", "mtp.{d}.final_norm.weight"),
        ]
        if not self.copies:
            return own
        return [*own, SharedCopy(f"{at}.embed_tokens.weight", lambda site: "embedding.weight"),
                SharedCopy(f"{at}.shared_head.head.weight", _head)]


#: Qwen3-Next's and Qwen3.5's count (the published config.json's; transformers' configs do not read it).
SEPARATE_COUNT = "mtp_num_hidden_layers"
#: Where those checkpoints keep the depth's decoder layer (``Family.mtp_layer``).
SEPARATE_LAYER = "mtp.layers.{d}"


@dataclass(frozen=True)
class SeparateMTP(Part):
    """mtp_num_hidden_layers <-> ``model.mtp.depths`` as Qwen3-Next and Qwen3.5 keep the depth, beside the model under
    ``mtp.``: ``pre_fc_norm_embedding`` (enorm), ``pre_fc_norm_hidden`` (hnorm), ``fc`` (eh_proj: the embedding's
    columns first, as ours; vLLM's qwen3_next_mtp concatenates ``[embedding; hidden]``), the decoder layer
    ``mtp.layers.{d}`` (the family's ``mtp_layer``) and ``norm`` (the final norm); no copies of the embedding or head.

    The depth's layer is a full-attention layer (vLLM builds it with layer_type full_attention) even where the
    model's block is a Gated DeltaNet: ``mtp.block.mixer`` is then the attention layers' mixer. Its norms are the
    block's (1 + w) RMSNorm. One fc and one pair of input norms serve every depth, so only one depth is read (the
    published checkpoints have one).
    """

    attention: AttentionFields

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        count = cfg.get_int(SEPARATE_COUNT, 0)
        if cfg.get("mtp_use_dedicated_embeddings", False):
            raise UserError(f"{cfg.family}: mtp_use_dedicated_embeddings is not supported (the MTP layer would read "
                            "an embedding of its own); supported: false, the model's embedding")
        cfg.mark_read(SEPARATE_COUNT, "mtp_use_dedicated_embeddings")
        if count > 1:
            raise UserError(f"{cfg.family}: mtp_num_hidden_layers {count} is not supported: its MTP layers share one "
                            "fc and one pair of input norms, and model.mtp gives each depth its own; supported: 0 or 1")
        if not count:
            return
        mtp: dict[str, Any] = {"depths": count}
        if model["block"]["mixer"].get("kind") != "attention":
            mtp["block"] = {"mixer": self.attention.read(cfg)}
        model["mtp"] = mtp

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mtp = view.model.mtp
        if mtp is not None:
            change = mtp.block.model_dump(exclude_none=True)
            mixer = change.get("mixer", {})  # a change of fields, or a kind by name
            kind = mixer if isinstance(mixer, str) else mixer.get("kind", "attention")
            if (mtp.depths != 1 or set(change) - {"mixer"} or kind != "attention"
                    or mtp.input_norm is not None or mtp.final_norm is not None):
                raise NotExpressible("model.mtp", f"Hugging Face {view.name}'s MTP layer is one depth running the "
                                     "model's block with its full-attention layers' mixer, with the block's norm on "
                                     "both inputs and before the head")
        config[SEPARATE_COUNT] = mtp.depths if mtp is not None else 0

    def rules(self) -> list[Rule]:
        return [
            Copy("mtp.pre_fc_norm_embedding.weight", "mtp.{d}.enorm.weight"),
            Copy("mtp.pre_fc_norm_hidden.weight", "mtp.{d}.hnorm.weight"),
            Copy("mtp.fc.weight", "mtp.{d}.eh_proj.weight"),
            Copy("mtp.norm.weight", "mtp.{d}.final_norm.weight"),
        ]


__all__ = ["LayerMTP", "PUBLISHED_COUNT", "SEPARATE_COUNT", "SEPARATE_LAYER", "SeparateMTP", "SharedCopy"]
