"""Registers the built-in layers. A third-party plugin looks exactly like this module.

Each component is registered by the path of its class and with its torch-free
``Params`` model, so that listing components (``specformer components``, ``schema``,
``--help``) imports no torch: the class is imported when a model is first built.
Each component's catalogue description is its Params model's docstring.
"""

from __future__ import annotations

from pydantic import BaseModel

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry
from specformer_layers.attention.cca_params import ConvolutionalAttentionParams
from specformer_layers.attention.block_pooled_params import BlockPooledIndexerParams
from specformer_layers.attention.mixture_of_heads_params import MixtureOfHeadsParams
from specformer_layers.attention.params import (CausalSelfAttentionParams, CompressedAttentionParams, LatentAttentionParams,
                                                LightningIndexerParams)
from specformer_layers.ffn.params import ChannelMixParams, GeGLUParams, GatedMLPParams, MLPParams, MoEParams, ParallelFFNParams, ReGLUParams
from specformer_layers.ffn.xielu_params import XIELUParams
from specformer_layers.linear.bitlinear_params import BitLinearParams
from specformer_layers.mixers.gated_deltanet_params import GatedDeltaNetParams
from specformer_layers.mixers.kda_params import KimiDeltaAttentionParams
from specformer_layers.mixers.lightning_params import LightningAttentionParams
from specformer_layers.mixers.mamba2_params import Mamba2Params
from specformer_layers.mixers.mamba_params import MambaParams
from specformer_layers.mixers.mlstm_params import MLSTMParams
from specformer_layers.mixers.parallel_params import ParallelMixerParams
from specformer_layers.mixers.rglru_params import RGLRUParams
from specformer_layers.mixers.rwkv4_params import Rwkv4Params
from specformer_layers.mixers.short_conv_params import ShortConvParams
from specformer_layers.layouts.params import (
    AbsentFFNParams,
    AbsentMixerParams,
    ParallelBlockParams,
    PostNormBlockParams,
    PostNormInsideBlockParams,
    PreNormBlockParams,
    SandwichBlockParams,
)
from specformer_layers.per_layer.params import PerLayerEmbeddingParams
from specformer_layers.norms.params import L2NormParams, LayerNormParams, NoNormParams, RMSNormParams, ScaleNormParams
from specformer_layers.norms.gated_params import GatedNormParams
from specformer_layers.norms.prediction_head_params import PredictionHeadParams
from specformer_layers.positional.params import (
    ALiBiParams,
    LearnedPositionsParams,
    NoPositionsParams,
    RotaryPositionsParams,
    SinusoidalPositionsParams,
)
from specformer_layers.positional.relative_bias_params import RelativeBiasParams
from specformer_layers.positional.rope_scaling.params import (
    DynamicNTKScalingParams,
    LinearScalingParams,
    Llama3ScalingParams,
    LongRopeScalingParams,
    ProportionalScalingParams,
    YarnScalingParams,
)
from specformer_layers.residual.params import HyperConnectionsParams, SingleStreamParams
from specformer_layers.routers.params import (
    BiasedSoftmaxTopKParams,
    HashParams,
    NormedSoftmaxTopKParams,
    SigmoidTopKParams,
    SoftmaxTopKParams,
    SparseMixerParams,
    SqrtSoftplusTopKParams,
    TopKSigmoidParams,
)

#: The kind this plugin adds: what ``rope``'s ``scaling`` param names.
ROPE_SCALING_KIND = "rope_scaling"
#: The kind this plugin adds: what ``moe``'s ``router`` param names.
ROUTER_KIND = "router"
#: The kind this plugin adds: what ``mla``'s ``indexer`` param names (sparse attention).
INDEXER_KIND = "indexer"
LINEAR_KIND = "linear"
#: The kind this plugin adds: a learned activation ``mlp``'s ``activation`` may name instead of a fixed one.
ACTIVATION_KIND = "activation"

#: (kind, name, class path under specformer_layers, Params, paper) of every built-in component.
COMPONENTS: tuple[tuple[str, str, str, type[BaseModel], str], ...] = (
    ("positional", "learned", "positional.learned:LearnedPositions", LearnedPositionsParams,
     "https://cdn.openai.com/better-language-models/language_models_are_unsupervised_multitask_learners.pdf"),
    ("positional", "sinusoidal", "positional.sinusoidal:SinusoidalPositions", SinusoidalPositionsParams,
     "https://arxiv.org/abs/1706.03762"),
    ("positional", "rope", "positional.rope:RotaryPositions", RotaryPositionsParams, "https://arxiv.org/abs/2104.09864"),
    ("positional", "alibi", "positional.alibi:ALiBi", ALiBiParams, "https://arxiv.org/abs/2108.12409"),
    ("positional", "none", "positional.nope:NoPositions", NoPositionsParams, "https://arxiv.org/abs/2305.19466"),
    ("positional", "relative_bias", "positional.relative_bias:RelativeBias", RelativeBiasParams,
     "https://arxiv.org/abs/1910.10683"),

    (ROPE_SCALING_KIND, "linear", "positional.rope_scaling.linear:LinearScaling", LinearScalingParams,
     "https://arxiv.org/abs/2306.15595"),
    (ROPE_SCALING_KIND, "dynamic", "positional.rope_scaling.dynamic:DynamicNTKScaling", DynamicNTKScalingParams,
     "https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/dynamically_scaled_rope_further_increases/"),
    (ROPE_SCALING_KIND, "yarn", "positional.rope_scaling.yarn:YarnScaling", YarnScalingParams,
     "https://arxiv.org/abs/2309.00071"),
    (ROPE_SCALING_KIND, "llama3", "positional.rope_scaling.llama3:Llama3Scaling", Llama3ScalingParams,
     "https://arxiv.org/abs/2407.21783"),
    (ROPE_SCALING_KIND, "proportional", "positional.rope_scaling.proportional:ProportionalScaling",
     ProportionalScalingParams, "https://huggingface.co/docs/transformers/main/en/model_doc/gemma4"),
    (ROPE_SCALING_KIND, "longrope", "positional.rope_scaling.longrope:LongRopeScaling", LongRopeScalingParams,
     "https://arxiv.org/abs/2402.13753"),

    ("norm", "layernorm", "norms.layernorm:LayerNorm", LayerNormParams, "https://arxiv.org/abs/1607.06450"),
    ("norm", "rmsnorm", "norms.rmsnorm:RMSNorm", RMSNormParams, "https://arxiv.org/abs/1910.07467"),
    ("norm", "scalenorm", "norms.scalenorm:ScaleNorm", ScaleNormParams, "https://arxiv.org/abs/1910.05895"),
    ("norm", "l2norm", "norms.l2norm:L2Norm", L2NormParams, "https://arxiv.org/abs/2010.04245"),
    ("norm", "none", "norms.none:NoNorm", NoNormParams, "https://cdn.openai.com/research-covers/language-unsupervised/language_understanding_paper.pdf"),
    ("norm", "prediction_head", "norms.prediction_head:PredictionHead", PredictionHeadParams,
     "https://arxiv.org/abs/1810.04805"),
    ("norm", "gated", "norms.gated:GatedNorm", GatedNormParams, "https://arxiv.org/abs/2505.06708"),

    ("ffn", "mlp", "ffn.mlp:MLP", MLPParams, "https://arxiv.org/abs/1706.03762"),
    ("ffn", "swiglu", "ffn.gated:GatedMLP", GatedMLPParams, "https://arxiv.org/abs/2002.05202"),
    ("ffn", "geglu", "ffn.gated:GatedMLP", GeGLUParams, "https://arxiv.org/abs/2002.05202"),
    ("ffn", "reglu", "ffn.gated:GatedMLP", ReGLUParams, "https://arxiv.org/abs/2002.05202"),
    ("ffn", "rwkv_channel_mix", "ffn.channel_mix:ChannelMix", ChannelMixParams, "https://arxiv.org/abs/2305.13048"),
    ("ffn", "moe", "ffn.moe:MoE", MoEParams, "https://arxiv.org/abs/2401.04088"),
    (ACTIVATION_KIND, "xielu", "ffn.xielu:XIELU", XIELUParams, "https://arxiv.org/abs/2411.13010"),
    (LINEAR_KIND, "bitlinear", "linear.bitlinear:BitLinear", BitLinearParams, "https://arxiv.org/abs/2402.17764"),
    ("ffn", "parallel", "ffn.parallel:ParallelFFN", ParallelFFNParams,
     "https://huggingface.co/docs/transformers/main/en/model_doc/gemma4"),
    ("ffn", "none", "layouts.absent:Absent", AbsentFFNParams, "https://arxiv.org/abs/2405.21060"),
    (ROUTER_KIND, "softmax_topk", "routers.softmax_topk:SoftmaxTopK", SoftmaxTopKParams, "https://arxiv.org/abs/1701.06538"),
    (ROUTER_KIND, "normed_softmax_topk", "routers.normed_softmax_topk:NormedSoftmaxTopK", NormedSoftmaxTopKParams,
     "https://huggingface.co/docs/transformers/main/en/model_doc/gemma4"),
    (ROUTER_KIND, "sigmoid_topk", "routers.sigmoid_topk:SigmoidTopK", SigmoidTopKParams, "https://arxiv.org/abs/2412.19437"),
    (ROUTER_KIND, "topk_sigmoid", "routers.topk_sigmoid:TopKSigmoid", TopKSigmoidParams,
     "https://ai.meta.com/blog/llama-4-multimodal-intelligence/"),
    (ROUTER_KIND, "sqrtsoftplus_topk", "routers.sqrtsoftplus_topk:SqrtSoftplusTopK", SqrtSoftplusTopKParams,
     "https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash-Base"),
    (ROUTER_KIND, "biased_softmax_topk", "routers.biased_softmax_topk:BiasedSoftmaxTopK", BiasedSoftmaxTopKParams,
     "https://huggingface.co/baidu/ERNIE-4.5-21B-A3B-PT"),
    (ROUTER_KIND, "hash", "routers.hash:HashRouter", HashParams, "https://arxiv.org/abs/2106.04426"),
    (ROUTER_KIND, "sparsemixer", "routers.sparsemixer:SparseMixer", SparseMixerParams, "https://arxiv.org/abs/2409.12136"),

    ("mixer", "attention", "attention.causal:CausalSelfAttention", CausalSelfAttentionParams,
     "https://arxiv.org/abs/1706.03762"),
    ("mixer", "mla", "attention.mla:LatentAttention", LatentAttentionParams, "https://arxiv.org/abs/2405.04434"),
    (INDEXER_KIND, "lightning", "attention.indexer:LightningIndexer", LightningIndexerParams,
     "https://arxiv.org/abs/2512.02556"),
    (INDEXER_KIND, "block_pooled", "attention.block_pooled:BlockPooledIndexer", BlockPooledIndexerParams,
     "https://huggingface.co/Aleph-Alpha/Kolibri-1.1"),
    ("mixer", "compressed", "attention.compressed:CompressedAttention", CompressedAttentionParams,
     "https://huggingface.co/deepseek-ai/DeepSeek-V4-Flash"),
    ("mixer", "cca", "attention.cca:ConvolutionalAttention", ConvolutionalAttentionParams,
     "https://arxiv.org/abs/2510.04476"),
    ("mixer", "moa", "attention.mixture_of_heads:MixtureOfHeads", MixtureOfHeadsParams, "https://arxiv.org/abs/2210.05144"),
    ("mixer", "short_conv", "mixers.short_conv:ShortConv", ShortConvParams, "https://arxiv.org/abs/2511.23404"),
    ("mixer", "kda", "mixers.kda:KimiDeltaAttention", KimiDeltaAttentionParams, "https://arxiv.org/abs/2510.26692"),
    ("mixer", "gated_deltanet", "mixers.gated_deltanet:GatedDeltaNet", GatedDeltaNetParams,
     "https://arxiv.org/abs/2412.06464"),
    ("mixer", "parallel", "mixers.parallel:ParallelMixer", ParallelMixerParams, "https://arxiv.org/abs/2507.22448"),
    ("mixer", "mamba2", "mixers.mamba2:Mamba2", Mamba2Params, "https://arxiv.org/abs/2405.21060"),
    ("mixer", "mamba", "mixers.mamba:Mamba", MambaParams, "https://arxiv.org/abs/2312.00752"),
    ("mixer", "rglru", "mixers.rglru:RGLRU", RGLRUParams, "https://arxiv.org/abs/2402.19427"),
    ("mixer", "rwkv4", "mixers.rwkv4:Rwkv4", Rwkv4Params, "https://arxiv.org/abs/2305.13048"),
    ("mixer", "lightning", "mixers.lightning:LightningAttention", LightningAttentionParams,
     "https://arxiv.org/abs/2501.08313"),
    ("mixer", "mlstm", "mixers.mlstm:MLSTM", MLSTMParams, "https://arxiv.org/abs/2405.04517"),
    ("mixer", "none", "layouts.absent:Absent", AbsentMixerParams, "https://arxiv.org/abs/2504.03624"),

    ("layout", "prenorm", "layouts.prenorm:PreNormBlock", PreNormBlockParams, "https://arxiv.org/abs/2002.04745"),
    ("layout", "postnorm", "layouts.postnorm:PostNormBlock", PostNormBlockParams, "https://arxiv.org/abs/1706.03762"),
    ("layout", "parallel", "layouts.parallel:ParallelBlock", ParallelBlockParams, "https://arxiv.org/abs/2204.06745"),
    ("layout", "sandwich", "layouts.sandwich:SandwichBlock", SandwichBlockParams, "https://arxiv.org/abs/2408.00118"),
    ("per_layer_input", "per_layer_embedding", "per_layer.embedding:PerLayerEmbedding", PerLayerEmbeddingParams,
     "https://ai.google.dev/gemma/docs/gemma-3n"),
    ("layout", "postnorm_inside", "layouts.postnorm_inside:PostNormInsideBlock", PostNormInsideBlockParams,
     "https://arxiv.org/abs/2501.00656"),

    ("residual", "single", "residual.single:SingleStream", SingleStreamParams, "https://arxiv.org/abs/1512.03385"),
    ("residual", "mhc", "residual.hyper_connections:HyperConnections", HyperConnectionsParams,
     "https://arxiv.org/abs/2512.24880"),
)


@hookimpl
def specformer_add_kinds(registry: PluginRegistry) -> None:
    registry.add_kind(
        ROPE_SCALING_KIND,
        doc="How a rotary positional scheme changes its frequencies to reach past its trained context.",
        sizes=("rotary_dim", "theta", "context_length"),
    )
    registry.add_kind(
        ROUTER_KIND,
        doc="Which experts of a mixture each token goes to, and with what weights: called with the tokens (N, D) "
            "(and token_ids (N,) when it declares reads_token_ids), returns (weights (N, top_k), experts (N, top_k), "
            "probs (N, n_experts)); weights_on says whether a weight scales the expert's output or its input.",
        sizes=("d_model", "n_experts", "top_k", "vocab_size"),
    )
    registry.add_kind(
        ACTIVATION_KIND,
        doc="A non-linearity with learned parameters of its own, made with no sizes (called on any tensor, "
            "elementwise); an mlp names one as its activation where a fixed function will not do.",
        sizes=(),
    )
    registry.add_kind(
        LINEAR_KIND,
        doc="A projection a layer makes in place of nn.Linear, with the same weight and bias (same names and shapes) "
            "but its own forward (BitLinear: ternary weights, int8 activations); splits are the row counts of the "
            "projections a fused one holds (q, k, v), for a quantiser that keeps one scale per projection.",
        sizes=("in_features", "out_features", "bias", "splits"),
    )
    registry.add_kind(
        INDEXER_KIND,
        doc="Which earlier keys each query of a sparse attention reads: made with the block width, the width of "
            "the query source the attention hands it and the attention's rotary channels; declares key_dim (what "
            "it adds per token to the cache) and topk, computes keys(x, positional, state) (B, 1, T, key_dim) and, "
            "per block of queries, selections(...) -> (rows, chosen (B, rows, n), readable (B, rows, n)); to learn "
            "while training, loss_coef, queries(...) and alignment_loss(...) (see specformer_layers.attention.indexer). "
            "One whose Params set reads_attention (block_pooled) instead scores a plain attention's own queries and "
            "keys: select(q, k, ctx=, k_positions=, rule=) -> (B, 1, Tq, S) bool, and declares keys_read.",
        sizes=("d_model", "query_dim", "positional_dim"),
    )


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    for kind, name, path, params, paper in COMPONENTS:
        registry.register(kind, name, factory=f"specformer_layers.{path}", params=params, paper=paper)
