"""Registers the built-in layers. A third-party plugin looks exactly like this module."""

from __future__ import annotations

from specformer.hookspecs import hookimpl
from specformer.registry import PluginRegistry
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.ffn.gated import GatedMLP, gated_params
from specformer_layers.ffn.mlp import MLP
from specformer_layers.layouts.postnorm import PostNormBlock
from specformer_layers.layouts.prenorm import PreNormBlock
from specformer_layers.norms.layernorm import LayerNorm
from specformer_layers.norms.rmsnorm import RMSNorm
from specformer_layers.positional.learned import LearnedPositions
from specformer_layers.positional.nope import NoPositions
from specformer_layers.positional.rope import RotaryPositions
from specformer_layers.positional.sinusoidal import SinusoidalPositions


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    def add(kind: str, name: str, cls: type, paper: str | None = None, **kwargs: object) -> None:
        registry.register(kind, name, factory=kwargs.pop("factory", cls.from_params),
                          params=kwargs.pop("params", getattr(cls, "Params", None)),
                          doc=kwargs.pop("doc", cls.__doc__), paper=paper)

    add("positional", "learned", LearnedPositions, "https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf")
    add("positional", "sinusoidal", SinusoidalPositions, "https://arxiv.org/abs/1706.03762")
    add("positional", "rope", RotaryPositions, "https://arxiv.org/abs/2104.09864")
    add("positional", "none", NoPositions, "https://arxiv.org/abs/2305.19466")

    add("norm", "layernorm", LayerNorm, "https://arxiv.org/abs/1607.06450")
    add("norm", "rmsnorm", RMSNorm, "https://arxiv.org/abs/1910.07467")

    add("ffn", "mlp", MLP, "https://arxiv.org/abs/1706.03762")
    for name, activation in (("swiglu", "silu"), ("geglu", "gelu"), ("reglu", "relu")):
        add("ffn", name, GatedMLP, "https://arxiv.org/abs/2002.05202", params=gated_params(activation),
            doc=f"Gated feed-forward, {activation} gate by default: " + (GatedMLP.__doc__ or ""))

    add("attention", "attention", CausalSelfAttention, "https://arxiv.org/abs/1706.03762")

    add("layout", "prenorm", PreNormBlock, "https://arxiv.org/abs/2002.04745")
    add("layout", "postnorm", PostNormBlock, "https://arxiv.org/abs/1706.03762")
