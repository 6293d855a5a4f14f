"""The xIELU activation of an ungated MLP (Apertus): hidden_act ``xielu`` <-> activation ``{kind: xielu}``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from specformer.errors import UserError

from specformer_hf.config import ConfigReader
from specformer_hf.parts.base import MLP, FamilyView
from specformer_hf.parts.feedforward import PlainMLP
from specformer_hf.rules import Copy, Rule, Site
from specformer_hf.specview import NotExpressible

#: transformers' XIELUActivation as ACT2CLS builds it: beta and eps are fixed (the config has no field for them).
XIELU = {"kind": "xielu", "beta": 0.5, "eps": -1e-6}


class XIELUConstant(Rule):
    """The checkpoint's copy of one of xIELU's constants (``mlp.act_fn.beta`` / ``eps``, a persistent buffer):
    checked against our activation's on import, written from it on export; no tensor of ours."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.hf, self.ours = (f"{MLP}.act_fn.{name}",), ()

    def expand_at(self, site: Site) -> tuple[tuple[str, ...], tuple[str, ...]]:
        hf, ours = super().expand_at(site)
        if not hasattr(site.ffn.activation, self.name):
            # A fixed activation (another hidden_act): transformers keeps no such buffer, and the name of ours below,
            # which no model has, makes import and export skip the rule as they skip a bias the spec leaves out.
            return hf, (f"blocks.{site.layer}.ffn.activation.{self.name}",)
        return hf, ours

    def to_ours(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        (stored,) = tensors
        ours = getattr(site.ffn.activation, self.name, None)
        if ours is None:
            raise UserError(f"layer {site.layer}: the checkpoint has xIELU's {self.name} but the spec's MLP has a fixed "
                            "activation")
        # (meta tensors when only the shapes are checked); compared at the stored precision
        if not stored.is_meta and not torch.equal(stored.float(), torch.tensor(ours, dtype=stored.dtype).float()):
            raise UserError(f"layer {site.layer}: the checkpoint's xIELU {self.name} is {stored.item()}, not "
                            f"{ours}; specformer reads transformers' constants (beta {XIELU['beta']}, eps {XIELU['eps']})")
        return []

    def to_hf(self, tensors: list[Tensor], site: Site) -> list[Tensor]:
        activation = site.ffn.activation
        return [torch.tensor(getattr(activation, self.name), dtype=activation.alpha_p.dtype)]


@dataclass(frozen=True)
class XIELUMLP(PlainMLP):
    """An ungated MLP without biases whose ``hidden_act`` may be ``xielu``: read as the learned ``xielu`` activation, its two scalars
    ``mlp.act_fn.alpha_p`` / ``alpha_n`` copied; any other hidden_act as :class:`PlainMLP` reads it."""

    def read(self, cfg: ConfigReader, model: dict[str, Any]) -> None:
        if cfg.get(self.act_key) != "xielu":
            super().read(cfg, model)
        else:
            model.setdefault("block", {})["ffn"] = {"kind": "mlp", "hidden": cfg.get_int("intermediate_size"),
                                                    "activation": dict(XIELU)}
        model["block"]["ffn"]["bias"] = False  # Apertus's projections never have biases

    def write(self, view: FamilyView, config: dict[str, Any]) -> None:
        view.block_kind("ffn", ("mlp",))
        if view.uniform("ffn", "bias"):
            raise NotExpressible("model.block.ffn.bias", f"Hugging Face {view.name}'s MLP has no biases")
        activation = view.uniform("ffn", "activation")
        if isinstance(activation, str):
            super().write(view, config)
            return
        if activation.get("kind") != "xielu" or any(activation.get(k) != v for k, v in XIELU.items()):
            raise NotExpressible("model.block.ffn.activation", f"{activation!r}: Hugging Face {view.name}'s learned "
                                 f"activation is xielu with beta {XIELU['beta']} and eps {XIELU['eps']}")
        hidden = view.uniform("ffn", "hidden") or 4 * view.model.d_model  # MLPParams' default width
        config.update({"intermediate_size": hidden, self.act_key: "xielu"})

    def rules(self) -> list[Rule]:
        return [*super().rules(), *(Copy(f"{MLP}.act_fn.{p}", f"blocks.{{i}}.ffn.activation.{p}")
                                    for p in ("alpha_p", "alpha_n")),
                XIELUConstant("beta"), XIELUConstant("eps")]


__all__ = ["XIELU", "XIELUConstant", "XIELUMLP"]
