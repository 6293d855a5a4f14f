"""The settings of the MoE routers, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized
from specformer.model.sized import linear


def check_top_k(*, n_experts: int, top_k: int) -> None:
    """A router keeps between 1 and all of its experts per token."""
    if not 0 < top_k <= n_experts:
        raise ValueError(f"top_k ({top_k}) must be between 1 and n_experts ({n_experts})")


def check_groups(*, n_experts: int, top_k: int, n_group: int, topk_group: int, min_per_group: int = 1) -> None:
    """Refuse a grouping that cannot split the experts or cannot hold ``top_k`` choices."""
    if n_group == 1:
        return
    if n_experts % n_group:
        raise ValueError(f"n_group ({n_group}) must divide n_experts ({n_experts})")
    per_group = n_experts // n_group
    if per_group < min_per_group:
        raise ValueError(f"each of the n_group ({n_group}) groups needs at least {min_per_group} experts; "
                         f"n_experts ({n_experts}) gives {per_group}")
    if top_k > topk_group * per_group:
        raise ValueError(f"top_k ({top_k}) exceeds the experts of the topk_group ({topk_group}) kept groups "
                         f"({topk_group} x {per_group} = {topk_group * per_group})")


class GroupedParams(Params):
    """Params of the top-k routers that weigh the chosen experts by their scores, with DeepSeek's grouped selection.

    ``softmax_topk`` and ``sigmoid_topk`` (so ``sqrtsoftplus_topk``) share these: grouped
    (device/node-limited) selection, the rescaling of the kept weights, their scale, and an
    optional learned bias on the scores.
    """

    n_group: int = Field(
        default=1, gt=0,
        description="Split the experts into this many contiguous groups (DeepSeek's devices/nodes); 1: no grouping.",
    )
    topk_group: int = Field(
        default=1, gt=0, description="Groups each token may choose experts from (with n_group > 1); at most n_group.",
    )
    normalize: bool = Field(
        default=True, description="Rescale the chosen experts' weights (probabilities or scores) to sum to 1 "
                                  "(norm_topk_prob).",
    )
    bias: bool = Field(
        default=False, description="A learned bias on each expert's score, trained with the weights (gpt-oss; "
                                   "not sigmoid_topk's selection_bias).",
    )
    scaling_factor: float = Field(
        default=1.0, gt=0, description="Multiplies the routing weights (DeepSeek's routed_scaling_factor).",
    )

    @model_validator(mode="after")
    def _groups_fit(self) -> "GroupedParams":
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group ({self.topk_group}) cannot exceed n_group ({self.n_group})")
        return self

    #: Experts each group needs: a group scored by its two best experts (sigmoid_topk) needs two.
    min_per_group: ClassVar[int] = 1

    def sized(self, *, d_model: int, n_experts: int, top_k: int) -> Sized:
        check_top_k(n_experts=n_experts, top_k=top_k)
        check_groups(n_experts=n_experts, top_k=top_k, n_group=self.n_group, topk_group=self.topk_group,
                     min_per_group=self.min_per_group)
        # The score projection (n_experts, d_model), biased when the router's params say so.
        return Sized(parameters=linear(d_model, n_experts, bias=self.bias))


class SoftmaxTopKParams(GroupedParams):
    """Softmax over the experts' scores; each token goes to the ``top_k`` most probable.

    Weights are the kept probabilities, rescaled to sum to one with ``normalize`` (Mixtral,
    Qwen3-MoE, and gpt-oss, whose softmax over the top-k logits is the same thing) or left
    as they are (Qwen2-MoE, Switch, DeepSeek-V2), then multiplied by ``scaling_factor``
    (DeepSeek's ``routed_scaling_factor``). ``bias`` adds a learned bias to the scores
    (gpt-oss). With ``n_group`` > 1 a token picks only among the experts of its
    ``topk_group`` groups with the highest best-expert probability (DeepSeek-V2's
    group-limited greedy routing).
    """


class SigmoidTopKParams(GroupedParams):
    """Independent sigmoid scores; the ``top_k`` experts are chosen by score plus a balancing bias.

    The bias (``selection_bias``, one value per expert, DeepSeek-V3's
    ``e_score_correction_bias``) only steers which experts are chosen; the weights are the
    chosen experts' plain sigmoid scores, rescaled to sum to one with ``normalize`` and
    multiplied by ``scaling_factor`` (DeepSeek-V3: 2.5). While training, the router counts
    how many tokens each expert received; after every optimizer step the train plugin moves
    each expert's bias by ``bias_update_rate`` towards balance (up for an under-loaded
    expert, down for an over-loaded one), so no auxiliary loss is needed (Wang et al.
    2024). With ``n_group`` > 1 a token picks only among the experts of its ``topk_group``
    groups whose two best biased scores sum highest (DeepSeek-V3's node-limited routing).

    The bias is a buffer saved with the weights and kept in float32 when the model is cast:
    steps of 0.001 would vanish in bfloat16. ``selection_bias: false`` drops it: the top-k of
    the plain scores, and no bias balancing (Flint, whose load is balanced by the auxiliary loss).
    ``bias_on: logit`` adds it to the experts' raw logits ``x W^T`` instead of their scores
    before the top-k (Kolibri-1's router): the weights stay the chosen experts' scores, but with
    a nonzero bias other experts win. ``logit_softcap`` bounds the logits smoothly to
    ``cap * tanh(logits / cap)`` before they are scored (Laguna's ``moe_router_logit_softcapping``),
    so no expert's score saturates.
    """

    #: A group's score sums its two best experts, so each group needs two.
    min_per_group: ClassVar[int] = 2

    bias_on: Literal["score", "logit"] = Field(
        default="score",
        description="What selection_bias is added to before the top-k: the experts' scores (DeepSeek-V3) or their raw "
                    "logits (Kolibri-1).",
    )

    bias_update_rate: float = Field(
        default=0.001, ge=0,
        description="How far training moves each expert's selection bias per step towards balanced load "
                    "(DeepSeek-V3's gamma); 0 keeps the bias fixed.",
    )
    logit_softcap: float | None = Field(
        default=None, gt=0,
        description="The router logits become cap * tanh(logits / cap) before scoring (Laguna); none: as they are.",
    )
    selection_bias: bool = Field(
        default=True,
        description="Keep the selection-only balancing bias; false: the experts are chosen by their plain scores and "
                    "the router holds no bias tensor (Flint), so bias_update_rate has nothing to move.",
    )


class TopKSigmoidParams(Params):
    """The ``top_k`` highest-scoring experts, each weighted by the sigmoid of its score, scaling the expert's input.

    As Llama 4 routes (transformers' ``Llama4Router`` and ``Llama4TextMoe``): scores are
    ``x W^T``, the experts are the ``top_k`` best scores, and a chosen expert ``e`` computes
    ``expert_e(sigmoid(score_e) * x)``; the outputs are summed without a further weight.
    Since the experts are not linear (SwiGLU), scaling the input is not the same as scaling
    the output: ``weights_on: output`` gives ``sigmoid(score_e) * expert_e(x)`` instead.
    Weights are not renormalised (a token's weights need not sum to one). Llama 4 pairs it
    with one always-on shared expert (``n_shared_experts: 1`` on the ``moe``).
    """

    weights_on: Literal["input", "output"] = Field(
        default="input",
        description="input: each chosen expert reads sigmoid(score) * x (Llama 4); output: its output is multiplied.",
    )

    def sized(self, *, d_model: int, n_experts: int, top_k: int) -> Sized:
        check_top_k(n_experts=n_experts, top_k=top_k)
        return Sized(parameters=linear(d_model, n_experts))  # the score projection (n_experts, d_model)


class SqrtSoftplusTopKParams(SigmoidTopKParams):
    """As ``sigmoid_topk``, with each expert scored ``sqrt(softplus(x W^T))`` instead of its sigmoid (DeepSeek-V4).

    Scores are unbounded above, unlike sigmoid's; the ``top_k`` experts are chosen by score
    plus the selection-only balancing bias, their weights are their scores rescaled to sum to
    one (``normalize``, always on in DeepSeek-V4) and multiplied by ``scaling_factor``
    (DeepSeek-V4's ``routed_scaling_factor``, 1.5).
    """


class BiasedSoftmaxTopKParams(SigmoidTopKParams):
    """As ``sigmoid_topk``, with each expert scored by a softmax over all experts' ``x W^T`` (ERNIE 4.5 MoE).

    The ``top_k`` experts are chosen by probability plus the selection-only balancing bias
    (ERNIE's ``e_score_correction_bias``, moved by ``bias_update_rate`` while training as
    ``sigmoid_topk``'s is); the weights are the chosen plain probabilities, divided by
    ``max(their sum, norm_min)`` with ``normalize`` (ERNIE's ``moe_norm_min``), then
    multiplied by ``scaling_factor``. Without the bias it is ``softmax_topk`` with
    ``normalize`` (the floor aside); grouping ranks a group by its two best biased
    probabilities, as ``sigmoid_topk`` does.
    """

    norm_min: float = Field(
        default=1e-12, ge=0,
        description="With normalize: the chosen weights are divided by max(their sum, norm_min) (ERNIE's moe_norm_min).",
    )


class HashParams(Params):
    """Experts fixed per token id by a table, not by a learned score; a learned score still weighs them (DeepSeek-V4).

    The table ``token_experts`` ``(vocab_size, top_k)`` lists each token id's experts
    (DeepSeek-V4's ``tid2eid``, loaded with the weights; never trained). A new model
    fills it with a fixed hash: token ``t`` goes to experts ``(h(t) + j) mod n_experts`` for
    ``j < top_k``, ``h(t) = (t * 2654435761 mod 2^32) mod n_experts`` (Knuth's
    multiplicative hash), so every expert gets a share of the vocabulary. The weights are
    the chosen experts' scores under ``scoring`` (of ``x W^T``), rescaled to sum to one
    with ``normalize`` and multiplied by ``scaling_factor``. The router reads the token ids
    of the forward (``ForwardContext.token_ids``), so it runs only inside a Decoder.
    """

    scoring: Literal["sqrtsoftplus", "sigmoid", "softmax"] = Field(
        default="sqrtsoftplus", description="How the learned scores weigh the chosen experts (DeepSeek-V4's scoring_func).",
    )
    normalize: bool = Field(default=True, description="Rescale the chosen experts' scores to sum to 1.")
    scaling_factor: float = Field(
        default=1.0, gt=0, description="Multiplies the routing weights (DeepSeek's routed_scaling_factor).",
    )

    @staticmethod
    def table_rows(vocab_size: int | None) -> int:
        """Rows of the ``token_experts`` table: one per token id; ValueError without a vocabulary size."""
        if vocab_size is None:
            raise ValueError("hash routing needs the vocabulary size (vocab_size): it keeps one row of experts per token id")
        return vocab_size

    def sized(self, *, d_model: int, n_experts: int, top_k: int, vocab_size: int | None = None) -> Sized:
        check_top_k(n_experts=n_experts, top_k=top_k)
        self.table_rows(vocab_size)
        # The score projection; the token_experts table is a buffer, not a parameter.
        return Sized(parameters=linear(d_model, n_experts))


class NormedSoftmaxTopKParams(Params):
    """Softmax top-k over the scores of the normalised token, each chosen expert's weight scaled by the expert (Gemma 4).

    The token is divided by its root mean square (``eps`` inside the root), multiplied per
    channel by a learned ``scale`` and by ``1/sqrt(d_model)``, then scored by one linear
    map; the ``top_k`` most probable experts of the softmax are kept, their probabilities
    rescaled to sum to one and multiplied by a learned per-expert scale:
    ``w_j = p_j / sum_kept p * s_e[j]``. Both scales start at one. In Gemma 4 the router reads
    the block's stream before any norm, while its experts read a normalised copy.
    """

    eps: float = Field(default=1e-6, gt=0, description="Added to the mean square of the token (rms_norm_eps).")

    def sized(self, *, d_model: int, n_experts: int, top_k: int) -> Sized:
        check_top_k(n_experts=n_experts, top_k=top_k)
        # The score projection, the per-channel scale of the token and the per-expert scale of the weights.
        return Sized(parameters=linear(d_model, n_experts) + d_model + n_experts)


class SparseMixerParams(Params):
    """PhiMoE's SparseMixer top-2 routing, at inference: each of the two experts is the best one left, its weight the
    softmax over the experts whose logits lie within a relative ``2 * jitter_eps`` of it.

    With logits ``s = x W^T``, the first expert is ``e1 = argmax s`` with weight
    ``softmax(s masked)[e1]``, where the softmax keeps only the experts ``j`` with
    ``(s[e1] - s[j]) / max(|s[j]|, s[e1]) <= 2 * jitter_eps`` (the others are -inf). The second
    is ``e2 = argmax`` of ``s`` without ``e1``, its weight the softmax over the experts other
    than ``e1`` with ``(s[e2] - s[j]) / max(|s[j]|, s[e2]) <= 2 * jitter_eps``. The weights are
    not renormalised: a token whose best logit stands far above the others weighs it by one.

    Training runs the same deterministic forward, and gradients flow through the two masked
    softmaxes as written. transformers' PhiMoE trains otherwise (Liu et al. 2024, *GRIN: GRadient-INformed
    MoE*): it samples each expert from its masked softmax (Gumbel-max) and backpropagates
    SparseMixer's Heun third-order estimate of the routing gradient; that estimator is not
    implemented here, so training from a PhiMoE checkpoint follows plain gradients of the
    deterministic weights.
    """

    jitter_eps: float = Field(
        default=0.01, ge=0,
        description="Relative logit distance (times 2) within which experts share the softmax of a choice "
                    "(PhiMoE's router_jitter_noise).",
    )

    def sized(self, *, d_model: int, n_experts: int, top_k: int) -> Sized:
        check_top_k(n_experts=n_experts, top_k=top_k)
        if top_k != 2:
            raise ValueError(f"sparsemixer routes each token to exactly 2 experts (top_k 2), got top_k {top_k}")
        return Sized(parameters=linear(d_model, n_experts))  # the score projection (n_experts, d_model)
