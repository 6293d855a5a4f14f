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
from specformer.spec.shapes import apply_change

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
        return separate_rules()


def separate_rules() -> list[Rule]:
    """The depth's own tensors in Qwen3-Next's layout (its decoder layer is the family's per-layer rules')."""
    return [
        Copy("mtp.pre_fc_norm_embedding.weight", "mtp.{d}.enorm.weight"),
        Copy("mtp.pre_fc_norm_hidden.weight", "mtp.{d}.hnorm.weight"),
        Copy("mtp.fc.weight", "mtp.{d}.eh_proj.weight"),
        Copy("mtp.norm.weight", "mtp.{d}.final_norm.weight"),
    ]


#: The block fields a typed MTP layer may differ in from the model's block.
TYPED_FIELDS = ("mixer", "positional", "ffn")


@dataclass(frozen=True)
class TypedMTP(Part):
    """The MTP layer in Qwen3-Next's layout (:class:`SeparateMTP`'s tensors) whose decoder layer is one of the main
    layers' kinds, chosen by ``mtp_layer_types`` (full_attention or sliding_attention: its window and positional
    scheme, as ``layers`` maps a main layer of that type; model.mtp.block.positional where it is not the model's) and
    ``mtp_mlp_layer_types`` (sparse: the block's experts; dense: a SwiGLU of intermediate_size). K-EXAONE (vLLM's
    exaone_moe_mtp: a global layer without rope, a dense MLP) and Mellum (a sliding layer by default).

    ``layers``: the family's part mapping layer_types (its ``layer_change``); ``count``: the config field of the
    count, ``aliases`` its other names; the defaults the families' configs give the two lists. One layer at most: one
    fc and one pair of input norms serve every layer.
    """

    layers: Any
    count: str
    aliases: tuple[str, ...] = ()
    attention_default: str = "full_attention"
    mlp_default: str = "dense"

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        names = (self.count, *self.aliases)
        count = next((cfg.get_int(n) for n in names if cfg.has(n) and cfg.get(n) is not None), 0)
        cfg.mark_read(*names, "mtp_layer_types", "mtp_mlp_layer_types")
        if count > 1:
            raise UserError(f"{cfg.family}: {self.count} {count} is not supported: its MTP layers share one fc and one "
                            "pair of input norms, and model.mtp gives each depth its own; supported: 0 or 1")
        if not count:
            return
        attention = self._one(cfg, "mtp_layer_types", self.attention_default, ("full_attention", "sliding_attention"))
        mlp = self._one(cfg, "mtp_mlp_layer_types", self.mlp_default, ("dense", "sparse"))
        change = self.layers.layer_change(cfg, model, attention)
        change["ffn"] = self._ffn(cfg, model, mlp)
        block = model["block"]
        if change["mixer"].get("window") == block["mixer"].get("window"):
            del change["mixer"]
        if change["ffn"] is None:
            del change["ffn"]
        model["mtp"] = {"depths": count, **({"block": change} if change else {})}

    @staticmethod
    def _one(cfg: ConfigReader, key: str, default: str, accepted: tuple[str, ...]) -> str:
        types = cfg.get(key, None) or [default]
        if not isinstance(types, list) or len(types) != 1 or types[0] not in accepted:
            raise UserError(f"{cfg.family}: {key} must give one of {', '.join(accepted)} for its one MTP layer, "
                            f"got {types!r}")
        return types[0]

    @staticmethod
    def _ffn(cfg: ConfigReader, model: dict[str, Any], mlp: str) -> dict[str, Any] | None:
        """The depth's ffn change: None for the block's own (the experts, or a dense block's MLP)."""
        ffn = model["block"]["ffn"]
        if mlp == "sparse":
            if ffn.get("kind") != "moe":
                raise UserError(f"{cfg.family}: mtp_mlp_layer_types sparse names experts, and this model's layers have "
                                "none; supported here: dense")
            return None
        dense = {"kind": "swiglu", "hidden": cfg.get_size("intermediate_size"), "activation": ffn.get("activation", "silu")}
        return None if ffn.get("kind") == "swiglu" and ffn.get("hidden") == dense["hidden"] else dense

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        mtp = view.model.mtp
        if mtp is None:
            return
        def whole(f: str, change: Any) -> dict[str, Any]:  # the depth's component: the block's with a change merged
            base = view.positional if f == "positional" else getattr(view.model.block, f).as_dict()
            return apply_change(dict(base), change)[0] if change is not None else dict(base)
        given = mtp.block.model_dump(exclude_none=True)
        if mtp.depths != 1 or set(given) - set(TYPED_FIELDS) or mtp.input_norm is not None or mtp.final_norm is not None:
            raise NotExpressible("model.mtp", f"Hugging Face {view.name}'s MTP layer is one depth whose layer is a main "
                                 "layer's kind (its mixer, positional scheme and ffn), with the block's norm on both "
                                 "inputs and before the head")
        depth = {f: whole(f, given.get(f)) for f in TYPED_FIELDS}
        attention = "sliding_attention" if depth["mixer"].get("window") is not None else "full_attention"
        mlp = "sparse" if depth["ffn"].get("kind") == "moe" else "dense"
        config.update({self.count: 1, "mtp_layer_types": [attention], "mtp_mlp_layer_types": [mlp]})
        # What import would make of the config written: the depth must be that layer.
        cfg = ConfigReader(config, defaults={}, family=view.name)
        base = {"positional": view.positional,
                "block": {f: getattr(view.model.block, f).as_dict() for f in ("mixer", "ffn")}}
        expected = self.layers.layer_change(cfg, base, attention)
        expected["ffn"] = self._ffn(cfg, base, mlp)
        for f in TYPED_FIELDS:
            if whole(f, expected.get(f)) != depth[f]:
                raise NotExpressible(f"model.mtp.block.{f}", f"Hugging Face {view.name}'s MTP layer is a "
                                     f"{attention} layer with a {mlp} MLP as its main layers of that kind are: "
                                     f"{whole(f, expected.get(f))}, not {depth[f]}")

    def rules(self) -> list[Rule]:
        return separate_rules()


__all__ = ["LayerMTP", "PUBLISHED_COUNT", "SEPARATE_COUNT", "SEPARATE_LAYER", "SeparateMTP", "SharedCopy", "TypedMTP",
           "separate_rules"]
