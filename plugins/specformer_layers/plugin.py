"""Registers the built-in layers. A third-party plugin looks exactly like this module."""

from __future__ import annotations

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.mla import LatentAttention
from specformer_layers.ffn.gated import GatedMLP, gated_params
from specformer_layers.ffn.mlp import MLP
from specformer_layers.ffn.moe import MoE
from specformer_layers.layouts.parallel import ParallelBlock
from specformer_layers.layouts.postnorm import PostNormBlock
from specformer_layers.layouts.postnorm_inside import PostNormInsideBlock
from specformer_layers.layouts.prenorm import PreNormBlock
from specformer_layers.layouts.sandwich import SandwichBlock
from specformer_layers.norms.layernorm import LayerNorm
from specformer_layers.norms.rmsnorm import RMSNorm
from specformer_layers.norms.scalenorm import ScaleNorm
from specformer_layers.positional.alibi import ALiBi
from specformer_layers.positional.learned import LearnedPositions
from specformer_layers.positional.nope import NoPositions
from specformer_layers.positional.rope import RotaryPositions
from specformer_layers.positional.rope_scaling.dynamic import DynamicNTKScaling
from specformer_layers.positional.rope_scaling.linear import LinearScaling
from specformer_layers.positional.rope_scaling.llama3 import Llama3Scaling
from specformer_layers.positional.rope_scaling.longrope import LongRopeScaling
from specformer_layers.positional.rope_scaling.yarn import YarnScaling
from specformer_layers.positional.sinusoidal import SinusoidalPositions
from specformer_layers.routers.sigmoid_topk import SigmoidTopK
from specformer_layers.routers.softmax_topk import SoftmaxTopK

#: The kind this plugin adds: what ``rope``'s ``scaling`` param names.
ROPE_SCALING_KIND = "rope_scaling"
#: The kind this plugin adds: what ``moe``'s ``router`` param names.
ROUTER_KIND = "router"


@hookimpl
def specformer_add_kinds(registry: PluginRegistry) -> None:
    registry.add_kind(
        ROPE_SCALING_KIND,
        doc="How a rotary positional scheme changes its frequencies to reach past its trained context.",
        sizes=("rotary_dim", "theta", "context_length"),
    )
    registry.add_kind(
        ROUTER_KIND,
        doc="Which experts of a mixture each token goes to, and with what weights: called with the tokens (N, D), "
            "returns (weights (N, top_k), experts (N, top_k), probs (N, n_experts)).",
        sizes=("d_model", "n_experts", "top_k"),
    )


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    def add(kind: str, name: str, cls: type, paper: str, **kwargs: object) -> None:
        registry.register(kind, name, factory=kwargs.pop("factory", cls.from_params),
                          params=kwargs.pop("params", getattr(cls, "Params", None)),
                          doc=kwargs.pop("doc", cls.__doc__), paper=paper)

    add("positional", "learned", LearnedPositions, "https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf")
    add("positional", "sinusoidal", SinusoidalPositions, "https://arxiv.org/abs/1706.03762")
    add("positional", "rope", RotaryPositions, "https://arxiv.org/abs/2104.09864")
    add("positional", "alibi", ALiBi, "https://arxiv.org/abs/2108.12409")
    add("positional", "none", NoPositions, "https://arxiv.org/abs/2305.19466")

    add(ROPE_SCALING_KIND, "linear", LinearScaling, "https://arxiv.org/abs/2306.15595")
    add(ROPE_SCALING_KIND, "dynamic", DynamicNTKScaling,
        "https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/dynamically_scaled_rope_further_increases/")
    add(ROPE_SCALING_KIND, "yarn", YarnScaling, "https://arxiv.org/abs/2309.00071")
    add(ROPE_SCALING_KIND, "llama3", Llama3Scaling, "https://arxiv.org/abs/2407.21783")
    add(ROPE_SCALING_KIND, "longrope", LongRopeScaling, "https://arxiv.org/abs/2402.13753")

    add("norm", "layernorm", LayerNorm, "https://arxiv.org/abs/1607.06450")
    add("norm", "rmsnorm", RMSNorm, "https://arxiv.org/abs/1910.07467")
    add("norm", "scalenorm", ScaleNorm, "https://arxiv.org/abs/1910.05895")

    add("ffn", "mlp", MLP, "https://arxiv.org/abs/1706.03762")
    for name, activation in (("swiglu", "silu"), ("geglu", "gelu"), ("reglu", "relu")):
        add("ffn", name, GatedMLP, "https://arxiv.org/abs/2002.05202", params=gated_params(activation),
            doc=f"Gated feed-forward, {activation} gate by default: " + (GatedMLP.__doc__ or ""))
    add("ffn", "moe", MoE, "https://arxiv.org/abs/2401.04088")
    add(ROUTER_KIND, "softmax_topk", SoftmaxTopK, "https://arxiv.org/abs/1701.06538")
    add(ROUTER_KIND, "sigmoid_topk", SigmoidTopK, "https://arxiv.org/abs/2412.19437")

    add("attention", "attention", CausalSelfAttention, "https://arxiv.org/abs/1706.03762")
    add("attention", "mla", LatentAttention, "https://arxiv.org/abs/2405.04434")

    add("layout", "prenorm", PreNormBlock, "https://arxiv.org/abs/2002.04745")
    add("layout", "postnorm", PostNormBlock, "https://arxiv.org/abs/1706.03762")
    add("layout", "parallel", ParallelBlock, "https://arxiv.org/abs/2204.06745")
    add("layout", "sandwich", SandwichBlock, "https://arxiv.org/abs/2408.00118")
    add("layout", "postnorm_inside", PostNormInsideBlock, "https://arxiv.org/abs/2501.00656")
