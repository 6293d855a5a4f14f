"""The settings of the mixture of attention heads, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from specformer.model.sized import linear, total
from specformer.registry.params import Params, Sized, SubComponent
from specformer_layers.routers.params import SoftmaxTopKParams


class MixtureOfHeadsParams(Params):
    """Mixture of attention heads: a router picks ``top_k`` of ``n_experts`` query/output projection pairs per token.

    Zhang et al. 2022, *Mixture of Attention Heads* (arXiv:2210.05144), as JetMoE uses it (Shen
    et al. 2024, *JetMoE*, arXiv:2404.07413): keys and values are projected once, ``n_kv_heads``
    heads of ``head_dim`` channels shared by every expert (``kv``, rows ``[k; v]``). Expert ``e``
    owns a query projection ``Q_e`` (``d_model -> n_kv_heads * head_dim``) and an output
    projection ``O_e`` (back to ``d_model``). For a token ``x`` routed to experts ``e_1..e_k``
    with weights ``w_1..w_k``, expert slot ``j`` gives ``n_kv_heads`` query heads ``Q_{e_j} x``,
    query head ``i`` of every slot reading key/value head ``i``: the layer attends with
    ``top_k * n_kv_heads`` query heads over ``n_kv_heads`` key/value heads, and its output is
    ``sum_j w_j O_{e_j} attn_j + b`` (``b`` only with ``out_bias``). The cache keeps the shared
    keys and values only, as grouped-query attention's. Queries and keys are rotated by the
    layer's positional scheme as the ``attention`` mixer's are.

    The ``router`` is a router component (default ``softmax_topk`` renormalised over the kept
    experts: JetMoE's softmax over the top-k logits); each forward sets ``aux_loss``, the
    Switch/Mixtral load-balancing loss ``n_experts * sum_e f_e P_e`` times ``aux_loss_coef``, as
    the ``moe`` feed-forward does (None when the coefficient is 0). Routers that read token ids
    (``hash``) or weight the expert's input (``topk_sigmoid``) are refused.
    """

    n_experts: int = Field(gt=1, description="Attention experts: query/output projection pairs.")
    top_k: int = Field(default=2, gt=0, description="Experts each token is routed to.")
    n_kv_heads: int = Field(gt=0, description="Key/value heads, shared by the experts; each expert has as many query heads.")
    head_dim: int | None = Field(default=None, gt=0, description="Channels per head; default d_model / n_kv_heads.")
    router: SubComponent("router") | None = Field(  # type: ignore[valid-type]
        default=None, description="The router component; default softmax_topk with the kept weights renormalised.",
    )
    out_bias: bool = Field(default=False, description="A bias added once to the mixed output (JetMoE's).")
    scale: float | None = Field(default=None, gt=0, description="Score scale; default 1 / sqrt(head_dim).")
    aux_loss_coef: float = Field(default=0.01, ge=0, description="Weight of the load-balancing loss in self.aux_loss.")
    dropout: float = Field(default=0.0, ge=0, lt=1, description="Dropout on the attention probabilities while training.")
    backend: Literal["auto", "sdpa", "flex", "eager"] = Field(
        default="auto", description="The attention kernel, as the attention mixer's backend.",
    )

    def dim(self, d_model: int) -> int:
        """Channels per head for ``d_model``; ValueError when ``n_kv_heads`` cannot split it."""
        if self.head_dim is not None:
            return self.head_dim
        if d_model % self.n_kv_heads:
            raise ValueError(f"moa: n_kv_heads ({self.n_kv_heads}) must divide d_model ({d_model}) unless head_dim is given")
        return d_model // self.n_kv_heads

    def router_params(self) -> Params:
        """The router's params: ``router``, else softmax top-k renormalised over the kept experts."""
        return self.router if self.router is not None else SoftmaxTopKParams(normalize=True)

    def sized(self, *, d_model: int) -> Sized:
        if self.top_k > self.n_experts:
            raise ValueError(f"moa: top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts})")
        KV, hd = self.n_kv_heads, self.dim(d_model)
        inner = KV * hd
        router = self.router_params().sized(d_model=d_model, n_experts=self.n_experts, top_k=self.top_k)
        parameters = total(
            router.parameters,
            linear(d_model, 2 * inner),  # the shared keys and values
            self.n_experts * 2 * inner * d_model,  # each expert's query and output projections
            d_model if self.out_bias else 0,
        )
        return Sized(parameters=parameters, n_heads=self.top_k * KV, n_kv_heads=KV, head_dim=hd)


__all__ = ["MixtureOfHeadsParams"]
