"""The settings of the feed-forward networks, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized, SubComponent
from specformer.model.sized import linear, total
from specformer_layers.routers.params import SoftmaxTopKParams

#: The non-linearities a spec can name (their functions: :mod:`.activations`).
Activation = Literal["gelu", "gelu_tanh", "relu", "relu2", "silu"]
#: How MoE's default router (no ``router`` given) orders softmax and top-k.
DefaultRouting = Literal["softmax_then_topk", "topk_then_softmax"]
#: gpt-oss's sigmoid slope in its clamped SwiGLU: g * sigmoid(1.702 g) approximates GELU.
GPT_OSS_SWIGLU_ALPHA = 1.702


def default_gated_hidden(d_model: int, multiple_of: int = 64) -> int:
    """Two thirds of 4 * d_model (same parameter count as a 4x MLP), rounded up to ``multiple_of``."""
    hidden = int(2 * 4 * d_model / 3)
    return (hidden + multiple_of - 1) // multiple_of * multiple_of


class MLPParams(Params):
    """``fc_out(act(fc_in(x)))``, widening to ``hidden`` channels in between."""

    hidden: int | None = Field(default=None, gt=0, description="Inner width; default 4 * d_model.")
    activation: Activation | SubComponent("activation") = Field(  # type: ignore[valid-type]
        default="gelu",
        description="Non-linearity between the two projections: a fixed one by name, or a learned activation "
                    "component (xielu: Apertus).",
    )
    bias: bool = Field(default=True, description="Biases on both projections.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the output.")

    def hidden_for(self, d_model: int) -> int:
        """The inner width for ``d_model``: ``hidden``, else 4 * d_model."""
        return self.hidden or 4 * d_model

    def sized(self, *, d_model: int) -> Sized:
        hidden = self.hidden_for(d_model)
        learned = 0 if isinstance(self.activation, str) else self.activation.sized().parameters
        return Sized(parameters=total(linear(d_model, hidden, bias=self.bias), linear(hidden, d_model, bias=self.bias),
                                      learned))


class ChannelMixParams(Params):
    """RWKV's channel mixing (Peng et al. 2023, arXiv:2305.13048; transformers' RwkvFeedForward).

    Each token's input is interpolated, per channel, with the previous token's (the token
    shift: ``x mu + x_prev (1 - mu)``, one ``mu`` for the key and one for the receptance);
    the output is ``sigmoid(receptance(x_r)) * value(relu(key(x_k))²)``, widening to ``hidden``
    channels in between. No biases. The previous token's input is a state a cached decode
    would keep; feed-forwards keep none yet, so a model with this kind runs without a cache
    (training, scoring) and refuses one.
    """

    hidden: int | None = Field(default=None, gt=0, description="Inner width (RWKV's intermediate_size); default 4 * d_model.")

    def hidden_for(self, d_model: int) -> int:
        """The inner width for ``d_model``: ``hidden``, else 4 * d_model."""
        return self.hidden or 4 * d_model

    def sized(self, *, d_model: int) -> Sized:
        hidden = self.hidden_for(d_model)
        return Sized(parameters=2 * d_model  # the token-shift interpolations of the key and the receptance
                     + linear(d_model, hidden, bias=False) + linear(hidden, d_model, bias=False)
                     + linear(d_model, d_model, bias=False))


class GatedMLPParams(Params):
    """Gated feed-forward, silu gate by default (SwiGLU): ``down(act(gate(x)) * up(x))``.

    The gate and up projections run as one matmul. ``gate_multiplier`` and
    ``output_multiplier`` give ``output_multiplier * down(act(gate_multiplier * gate(x)) * up(x))``,
    Falcon-H1's muP ``mlp_multipliers`` (Zuo et al. 2025); at 1 they do nothing.
    """

    hidden: int | None = Field(default=None, gt=0, description="Inner width; default 8/3 * d_model rounded up to 64.")
    activation: Activation = Field(default="silu", description="Non-linearity on the gate.")
    bias: bool = Field(default=False, description="Biases on the projections.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the output.")
    gate_multiplier: float = Field(default=1.0, description="The gate projection's output is multiplied by this before the activation (Falcon-H1).")
    output_multiplier: float = Field(default=1.0, description="The output is multiplied by this (Falcon-H1).")
    inner_norm: SubComponent("norm") | None = Field(  # type: ignore[valid-type]
        default=None, description="A norm over the hidden channels act(gate) * up right before the down projection "
                                  "(BitNet's ffn_sub_norm).",
    )
    linear: SubComponent("linear") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="The projections' kind in place of nn.Linear, same weights (bitlinear: ternary weights, int8 "
                    "activations); the fused gate/up keeps one quantiser scale per projection.",
    )

    def hidden_for(self, d_model: int) -> int:
        """The inner width for ``d_model``: ``hidden``, else :func:`default_gated_hidden`."""
        return self.hidden or default_gated_hidden(d_model)

    def sized(self, *, d_model: int) -> Sized:
        hidden = self.hidden_for(d_model)  # gate and up as one projection of 2 * hidden rows
        if self.linear is None:
            projections = total(linear(d_model, 2 * hidden, bias=self.bias), linear(hidden, d_model, bias=self.bias))
        else:
            projections = total(
                self.linear.sized(in_features=d_model, out_features=2 * hidden, bias=self.bias,
                                  splits=(hidden, hidden)).parameters,
                self.linear.sized(in_features=hidden, out_features=d_model, bias=self.bias).parameters)
        return Sized(parameters=total(projections,
                                      self.inner_norm.sized(dim=hidden).parameters if self.inner_norm is not None else 0))


class GeGLUParams(GatedMLPParams):
    """Gated feed-forward, gelu gate by default (GeGLU): ``down(act(gate(x)) * up(x))``.

    The gate and up projections run as one matmul.
    """

    activation: Activation = Field(default="gelu", description="Non-linearity on the gate.")


class ReGLUParams(GatedMLPParams):
    """Gated feed-forward, relu gate by default (ReGLU): ``down(act(gate(x)) * up(x))``.

    The gate and up projections run as one matmul.
    """

    activation: Activation = Field(default="relu", description="Non-linearity on the gate.")


#: The gated feed-forward's params by the default activation of the gate.
GATED_PARAMS: dict[str, type[GatedMLPParams]] = {"silu": GatedMLPParams, "gelu": GeGLUParams, "relu": ReGLUParams}


def gated_params(default_activation: str) -> type[GatedMLPParams]:
    """The gated feed-forward's Params whose gate activation defaults to ``default_activation``."""
    try:
        return GATED_PARAMS[default_activation]
    except KeyError:
        raise ValueError(f"no gated params for activation {default_activation!r}; "
                         f"defined: {', '.join(sorted(GATED_PARAMS))}") from None


class MoEParams(Params):
    """A router sends each token to ``top_k`` of ``n_experts`` feed-forward experts; their outputs are mixed.

    The ``router`` is a component of its own kind (``softmax_topk``, ``sigmoid_topk`` or a
    plugin's): it returns, for each token, the chosen experts and their weights. Without
    one, ``routing``/``normalize_topk`` describe the default softmax top-k router:
    ``softmax_then_topk`` keeps the ``top_k`` largest probabilities and, with
    ``normalize_topk``, rescales them to sum to one (Mixtral, Qwen3-MoE; without it,
    Qwen2-MoE and Switch); ``topk_then_softmax`` is the softmax over the top-k logits (the
    same weights as normalised softmax-then-top-k).

    Experts are gated (SwiGLU with the default ``silu``, as Mixtral and Qwen-MoE) or plain
    MLPs, with biases when ``expert_bias`` (gpt-oss). ``swiglu_limit`` switches gated
    experts to gpt-oss's clamped SwiGLU: ``(clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g)``
    with ``g = min(gate, limit)``; with ``swiglu_style: silu`` it is DeepSeek-V4's
    ``silu(g) * clamp(up, -limit, limit)``, on the shared experts too. ``n_shared_experts`` adds an always-on expert of width
    ``shared_hidden`` (DeepSeek-MoE, ungated; ``shared_gate`` scales it by a learned
    sigmoid gate as Qwen2-MoE does; ``shared_combine: average`` takes the mean of the routed mix and
    the shared experts' output, ``(routed + shared) / 2``, instead of their sum, as Cohere's
    Command A MoE does). ``output_bias`` adds one bias vector to the mixture's output, whatever
    the experts chosen (JetMoE). ``output_norm`` normalises the mixture's whole output, routed and
    shared experts combined, before it joins the residual stream (A.X-K1's ``post_mlp_layernorm``,
    an RMSNorm). ``expert_norm`` gives every expert a norm of its own on its output, before it is
    weighted: each routed expert ``e`` computes ``norm_e(expert_e(x))``, and the shared experts'
    output is ``norm_s(shared(x))`` (Amazon's Ergo, RMSNorms; the routed experts' weights are one
    ``(n_experts, ...)`` stack per norm parameter, split over ``ep`` with the experts). Dense layers in an MoE model (DeepSeek-V3's
    ``first_k_dense_replace``, Qwen3-MoE's ``mlp_only_layers``) are ``layers:`` overrides
    giving those layers another ffn.

    Dropless: every token reaches all its experts, whatever the load. Tokens are sorted
    by expert and each expert runs once on its contiguous block (one matmul pair per
    expert, no loop over tokens); without autograd the blocks are written in place into one
    buffer. Each token's weighted outputs are summed in a fixed order, so results repeat
    exactly and a token's sum does not depend on the other tokens in the batch. Each
    forward sets ``self.aux_loss``: the Switch/Mixtral load-balancing loss
    ``n_experts * sum_e f_e * P_e`` (``f_e``: share of the routing slots that went to
    expert ``e``, summing to ``top_k``; ``P_e``: mean router probability of ``e``) times
    ``aux_loss_coef`` (None when the coefficient is 0); ``Decoder.auxiliary_loss()`` adds
    these up over layers for the trainer.
    """

    n_experts: int = Field(default=8, gt=1, description="Number of routed experts.")
    top_k: int = Field(default=2, gt=0, description="Experts each token is sent to.")
    hidden: int | None = Field(
        default=None, gt=0,
        description="Inner width of each expert; default 8/3 * d_model rounded up to 64 (gated) or 4 * d_model.",
    )
    activation: Activation = Field(default="silu", description="Non-linearity of the experts (on the gate when gated).")
    gated: bool = Field(default=True, description="Gated experts down(act(gate(x)) * up(x)) (SwiGLU with silu); false: plain MLPs.")
    router: SubComponent("router") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="The router component ({kind: softmax_topk|sigmoid_topk|<a plugin's>, ...}); "
                    "default softmax_topk as routing and normalize_topk say.",
    )
    routing: DefaultRouting = Field(
        default="softmax_then_topk",
        description="Default router only: softmax_then_topk: softmax over all experts, keep the top k; "
                    "topk_then_softmax: softmax over the top k logits.",
    )
    normalize_topk: bool = Field(
        default=True, description="Default router only: rescale the kept top-k probabilities to sum to 1.",
    )
    expert_bias: bool = Field(default=False, description="Biases on every expert's projections (gpt-oss).")
    swiglu_limit: float | None = Field(
        default=None, gt=0,
        description="gpt-oss's clamped SwiGLU: clamp the gate above and the up projection to +-limit, "
                    "then (up + 1) * gate * sigmoid(swiglu_alpha * gate); null: the activation as usual.",
    )
    swiglu_alpha: float | None = Field(
        default=None, gt=0, description="Sigmoid slope of the clamped SwiGLU (with swiglu_limit only); default 1.702 (gpt-oss).",
    )
    swiglu_style: Literal["gpt_oss", "silu"] = Field(
        default="gpt_oss",
        description="With swiglu_limit: gpt_oss: (up + 1) * gate * sigmoid(swiglu_alpha * gate); silu: silu(gate) * up, "
                    "on the routed and the shared experts (DeepSeek-V4).",
    )
    n_shared_experts: int = Field(default=0, ge=0, description="Always-on experts every token goes through (0: none).")
    shared_hidden: int | None = Field(
        default=None, gt=0, description="Total inner width of the shared experts; default n_shared_experts * hidden.",
    )
    shared_gate: bool = Field(default=False, description="Multiply the shared experts' output by sigmoid(w . x) (Qwen2-MoE).")
    shared_combine: Literal["sum", "average"] = Field(
        default="sum",
        description="How the shared experts' output joins the routed mix: sum: routed + shared; "
                    "average: (routed + shared) / 2 (Cohere2-MoE).",
    )
    output_norm: SubComponent("norm") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="A norm on the mixture's output (routed and shared experts combined), e.g. {kind: rmsnorm} "
                    "(A.X-K1's post_mlp_layernorm); null: none.",
    )
    output_bias: bool = Field(
        default=False, description="A bias added once to the mixture's output (JetMoE's), before output_norm.",
    )
    expert_norm: SubComponent("norm") | None = Field(  # type: ignore[valid-type]
        default=None,
        description="A norm of its own on each expert's output, before the routing weight: one per routed expert "
                    "and one on the shared experts' output, e.g. {kind: rmsnorm} (Ergo); null: none.",
    )
    aux_loss_coef: float = Field(default=0.01, ge=0, description="Weight of the load-balancing loss in self.aux_loss.")

    @model_validator(mode="after")
    def _consistent(self) -> "MoEParams":
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts})")
        if self.n_shared_experts == 0 and (self.shared_hidden is not None or self.shared_gate
                                           or self.shared_combine != "sum"):
            raise ValueError("shared_hidden, shared_gate and shared_combine need n_shared_experts >= 1")
        if self.router is not None and {"routing", "normalize_topk"} & self.model_fields_set:
            raise ValueError("routing and normalize_topk describe the default router; with router given, "
                             "set them in the router ({kind: softmax_topk, normalize: ...})")
        if self.routing == "topk_then_softmax" and not self.normalize_topk:
            raise ValueError("topk_then_softmax always yields weights summing to 1; normalize_topk: false needs softmax_then_topk")
        if self.swiglu_limit is not None and (not self.gated or self.activation != "silu"):
            raise ValueError("swiglu_limit (gpt-oss's clamped SwiGLU) needs gated: true and activation: silu")
        if self.swiglu_limit is None and self.swiglu_alpha is not None:
            raise ValueError("swiglu_alpha is used only with swiglu_limit (gpt-oss's clamped SwiGLU)")
        if self.swiglu_style == "silu" and (self.swiglu_limit is None or self.swiglu_alpha is not None):
            raise ValueError("swiglu_style silu (DeepSeek-V4's clamped SwiGLU) needs swiglu_limit and takes no swiglu_alpha")
        return self

    def hidden_for(self, d_model: int) -> int:
        """Each expert's inner width for ``d_model``: ``hidden``, else the gated or plain default."""
        return self.hidden or (default_gated_hidden(d_model) if self.gated else 4 * d_model)

    def shared_params(self, d_model: int) -> MLPParams | GatedMLPParams | None:
        """The always-on shared experts as one feed-forward's params, or None without them."""
        if not self.n_shared_experts:
            return None
        shared_hidden = self.shared_hidden or self.n_shared_experts * self.hidden_for(d_model)
        if self.gated:
            return GatedMLPParams(hidden=shared_hidden, activation=self.activation)
        return MLPParams(hidden=shared_hidden, activation=self.activation, bias=False)

    def default_router(self) -> SoftmaxTopKParams:
        """The router's params when ``router`` is not given: softmax top-k as ``routing`` and ``normalize_topk`` say."""
        # topk_then_softmax is the normalised softmax over the kept experts.
        return SoftmaxTopKParams(normalize=self.normalize_topk or self.routing == "topk_then_softmax")

    def sized(self, *, d_model: int, vocab_size: int | None = None) -> Sized:
        n, hidden = self.n_experts, self.hidden_for(d_model)
        if self.router is not None:
            router = self.router.sized(d_model=d_model, n_experts=n, top_k=self.top_k, vocab_size=vocab_size)
        else:
            router = self.default_router().sized(d_model=d_model, n_experts=n, top_k=self.top_k)
        width_in = (2 if self.gated else 1) * hidden
        experts = n * width_in * d_model + n * d_model * hidden + (n * (width_in + d_model) if self.expert_bias else 0)
        shared = self.shared_params(d_model)
        shared_count = shared.sized(d_model=d_model).parameters if shared is not None else 0
        gate = linear(d_model, 1) if shared is not None and self.shared_gate else 0
        out_norm = self.output_norm.sized(dim=d_model).parameters if self.output_norm is not None else 0
        out_bias = d_model if self.output_bias else 0
        # One norm per routed expert, and one on the shared experts' output when there are shared experts.
        per_norm = self.expert_norm.sized(dim=d_model).parameters if self.expert_norm is not None else 0
        expert_norms = None if per_norm is None else per_norm * (n + (1 if shared is not None else 0))
        return Sized(parameters=total(router.parameters, experts, shared_count, gate, out_norm, out_bias, expert_norms))


class ParallelFFNParams(Params):
    """Several feed-forwards side by side on the same input, each between a norm of its own before and after, summed.

    ``out = sum_i post_i(ffn_i(pre_i(x)))``, with ``pre_i`` and ``post_i`` made from ``norm``
    (Gemma 4's mixture-of-experts model, 26B-A4B: a dense GeGLU beside a mixture of experts in
    every layer, each branch normalised on the way in and out, then the block's own post-norm
    over the sum).
    A mixture (``moe``) among them routes on ``x`` itself, before its pre-norm, when
    ``route_unnormed`` is set, as Gemma 4's router does. The block's layout should then hand
    the feed-forward the raw stream (``sandwich`` with ``ffn_pre_norm: false``): each branch
    brings its own pre-norm.
    """

    ffns: list[SubComponent("ffn")] = Field(  # type: ignore[valid-type]
        min_length=2, description="The feed-forwards run on the same input (components of the ffn kind).",
        examples=[[{"kind": "geglu", "hidden": 64}, {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 32}]],
    )
    norm: SubComponent("norm") = Field(  # type: ignore[valid-type]
        default="rmsnorm", validate_default=True, description="The norm made before and after each feed-forward.",
    )
    route_unnormed: bool = Field(
        default=True, description="A mixture among the ffns routes on the input before its pre-norm (Gemma 4).",
    )

    def sized(self, *, d_model: int, layer_index: int = 0, n_layers: int = 1) -> Sized:
        ffns = [ffn.sized(d_model=d_model, layer_index=layer_index, n_layers=n_layers) for ffn in self.ffns]
        norm = self.norm.sized(dim=d_model).parameters  # made twice per feed-forward: before and after
        return Sized(parameters=total(*(f.parameters for f in ffns), *(2 * [norm] * len(ffns))))
