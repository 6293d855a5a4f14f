"""Sparse mixture-of-experts feed-forward (Shazeer et al. 2017; Switch, Mixtral, Qwen-MoE, DeepSeek-MoE, gpt-oss)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.context import ForwardContext
from specformer.model.expert_parallel import dispatch, keep_local_experts
from specformer.model.parallel_plan import ParallelPlan, Split

from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.ffn.gated import GatedMLP
from specformer_layers.ffn.mlp import MLP
from specformer_layers.ffn.params import GPT_OSS_SWIGLU_ALPHA, MoEParams
from specformer_layers.routers.base import Routing
from specformer_layers.routers.softmax_topk import SoftmaxTopK


class MoE(nn.Module):
    """Sparse mixture of experts: a router picks ``top_k`` of ``n_experts`` per token (:class:`MoEParams`)."""

    Params = MoEParams

    def __init__(self, params: MoEParams | None = None, *, d_model: int, vocab_size: int | None = None) -> None:
        params = params if params is not None else MoEParams()
        super().__init__()
        n_experts, top_k, gated = params.n_experts, params.top_k, params.gated
        hidden = params.hidden_for(d_model)
        shared = params.shared_params(d_model)
        self.d_model = d_model
        self.n_experts = n_experts
        self.top_k = top_k
        self.hidden = hidden
        self.gated = gated
        self.swiglu_limit = params.swiglu_limit
        self.swiglu_alpha = GPT_OSS_SWIGLU_ALPHA if params.swiglu_alpha is None else params.swiglu_alpha
        self.swiglu_style = params.swiglu_style
        self.aux_loss_coef = params.aux_loss_coef
        self.shared_combine = params.shared_combine
        self.activation = ACTIVATIONS[params.activation]
        if params.router is not None:
            self.router = params.router.make(d_model=d_model, n_experts=n_experts, top_k=top_k, vocab_size=vocab_size)
        else:
            self.router = SoftmaxTopK(params.default_router(), d_model=d_model, n_experts=n_experts, top_k=top_k)
        # Expert e's input projection is experts_in[e] (rows [gate; up] when gated), as nn.Linear stores it.
        width_in = (2 if gated else 1) * hidden
        self.experts_in = nn.Parameter(torch.empty(n_experts, width_in, d_model))
        self.experts_out = nn.Parameter(torch.empty(n_experts, d_model, hidden))
        self.experts_in_bias = nn.Parameter(torch.zeros(n_experts, width_in)) if params.expert_bias else None
        self.experts_out_bias = nn.Parameter(torch.zeros(n_experts, d_model)) if params.expert_bias else None
        self.shared: nn.Module | None = None
        self.shared_gate: nn.Linear | None = None
        if shared is not None:
            self.shared = GatedMLP(shared, d_model=d_model) if gated else MLP(shared, d_model=d_model)
            if params.shared_gate:
                self.shared_gate = nn.Linear(d_model, 1, bias=False)
        self.output_bias = nn.Parameter(torch.zeros(d_model)) if params.output_bias else None
        self.output_norm: nn.Module | None = params.output_norm.make(dim=d_model) if params.output_norm is not None else None
        # Per-expert norms (Ergo): each of the template's parameters becomes one (n_experts, ...) stack, split over ep
        # with the experts; the template (not registered) runs expert e's slice through torch.func.functional_call.
        self.expert_norm_names: tuple[str, ...] = ()
        self._expert_norm: tuple[nn.Module, ...] = ()
        self.shared_norm: nn.Module | None = None
        if params.expert_norm is not None:
            template = params.expert_norm.make(dim=d_model)
            if any(True for _ in template.buffers()):
                raise ValueError(f"moe expert_norm: {params.expert_norm.component.name} keeps buffers; a per-expert norm "
                                 "must hold parameters only (e.g. rmsnorm, layernorm)")
            self._expert_norm = (template,)
            names = []
            for name, param in template.named_parameters():
                stacked = f"expert_norm_{name.replace('.', '_')}"
                setattr(self, stacked, nn.Parameter(param.detach().expand(n_experts, *param.shape).clone()))
                names.append(stacked)
            self.expert_norm_names = tuple(names)
            self._expert_norm_params = tuple(name for name, _ in template.named_parameters())
            if shared is not None:
                self.shared_norm = params.expert_norm.make(dim=d_model)
        self.aux_loss: Tensor | None = None
        #: The process group the experts are split over (expert parallelism), None when this process holds all.
        self.expert_group: Any = None
        # A router that reads token ids (hash routing) needs the forward context from the block.
        self.reads_context = bool(getattr(self.router, "reads_token_ids", False))
        nn.init.normal_(self.experts_in, std=0.02)
        nn.init.normal_(self.experts_out, std=0.02)

    def parallel_plan(self) -> ParallelPlan:
        """Whole experts over ep (each token sent to the devices of its top_k experts); the router replicated.

        The shared experts declare their own plan (tp, as a dense ffn's).
        """
        experts = (Split("ep", 0, self.n_experts, "experts"),)
        return {name: experts for name in self.expert_stacks()}

    def expert_stacks(self) -> tuple[str, ...]:
        """The names of the parameters stacked by expert (first dimension ``n_experts``), split over ``ep``."""
        return ("experts_in", "experts_out", "experts_in_bias", "experts_out_bias", *self.expert_norm_names)

    def forward(self, x: Tensor, ctx: ForwardContext | None = None, *, route_from: Tensor | None = None) -> Tensor:
        """The experts' mix for ``x``; ``route_from`` (the shape of ``x``): what the router reads instead of ``x``
        (Gemma 4 routes on the stream before the norm its experts read); ``ctx``: the forward's context, for a
        router that reads the token ids (hash routing)."""
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # (N, D)
        routed = tokens if route_from is None else route_from.reshape(-1, shape[-1])
        if self.reads_context:
            if ctx is None or ctx.token_ids is None:
                raise ValueError("this moe's router reads token ids: run it inside a Decoder (ForwardContext.token_ids)")
            weights, experts, probs = self.router(routed, token_ids=ctx.token_ids.reshape(-1))
        else:
            weights, experts, probs = self.route(routed)
        # No loss term at all when its weight is 0 (DeepSeek-V3 balances by bias instead).
        self.aux_loss = (self.aux_loss_coef * load_balancing_loss(probs, experts, self.n_experts)
                         if self.aux_loss_coef else None)
        on_input = getattr(self.router, "weights_on", "output") == "input"
        out = self.run_experts(tokens, experts, weights.to(x.dtype), on_input=on_input)
        if self.shared is not None:
            shared = self.run_shared(tokens)
            if self.shared_norm is not None:  # Ergo: the shared expert ends with a norm of its own, before any gate
                shared = self.shared_norm(shared)
            if self.shared_gate is not None:
                shared = shared * torch.sigmoid(self.shared_gate(tokens))
            out = out + shared
            if self.shared_combine == "average":  # Cohere2-MoE: the mean of the routed mix and the shared experts
                out = out / 2
        if self.output_bias is not None:  # JetMoE: one bias for the whole mixture, not one per expert
            out = out + self.output_bias
        if self.output_norm is not None:  # A.X-K1: the whole mixture's output normalised
            out = self.output_norm(out)
        return out.view(shape)

    def route(self, tokens: Tensor) -> Routing:
        """The router's mixing weights ``(N, k)``, chosen experts ``(N, k)`` and probabilities ``(N, E)``."""
        return self.router(tokens)

    def run_experts(self, tokens: Tensor, experts: Tensor, weights: Tensor, *, on_input: bool = False) -> Tensor:
        """``sum_j weights[n, j] * expert_{experts[n, j]}(tokens[n])`` for every token ``n``.

        ``on_input``: ``sum_j expert_{experts[n, j]}(weights[n, j] * tokens[n])`` instead (Llama 4).
        """
        n_tokens, k = experts.shape
        slots = experts.flatten()  # (N*k,): the expert of each (token, choice) slot
        order = slots.argsort(stable=True)  # slots grouped by expert
        # Counted with scatter_add rather than bincount, whose output size depends on the
        # data: torch.compile can trace this one.
        counts = torch.zeros(self.n_experts, dtype=torch.long, device=slots.device)
        counts = counts.scatter_add(0, slots, torch.ones_like(slots))
        token_of = order // k  # (N*k,): the token of each slot, sorted by expert
        grouped = tokens.index_select(0, token_of)  # (N*k, D): each slot's token, sorted by expert
        grouped_weights = weights.flatten().index_select(0, order)[:, None]  # (N*k, 1), in the same order
        if on_input:
            grouped = grouped * grouped_weights
        if self.expert_group is None:
            sorted_out = self.run_local_experts(grouped, counts.tolist())  # (N*k, D), sorted by expert
        else:  # expert parallel: each slot computed by the process that owns its expert
            sorted_out = dispatch(grouped, counts, self.expert_group, self.run_local_experts)
        if not on_input:
            if torch.is_grad_enabled() or torch.compiler.is_compiling():
                sorted_out = sorted_out * grouped_weights
            else:
                sorted_out.mul_(grouped_weights)
        return _combine(sorted_out, token_of=token_of, order=order, n_tokens=n_tokens)

    def run_local_experts(self, grouped: Tensor, sizes: list[int]) -> Tensor:
        """Each expert this process holds on its block of ``grouped`` ``(S, D)`` (``sizes[e]`` rows, in order)."""
        w_in, w_out, b_in, b_out = (_per_expert(p) for p in
                                    (self.experts_in, self.experts_out, self.experts_in_bias, self.experts_out_bias))
        norms = [_per_expert(getattr(self, name)) for name in self.expert_norm_names]
        if torch.is_grad_enabled() or torch.compiler.is_compiling():
            # Autograd needs each block as a new tensor (out= has no gradient), and the compiler
            # traces this functional form: the blocks are concatenated.
            return torch.cat([
                self.expert_normed(F.linear(self.hidden_activation(F.linear(block, w_in[e], None if b_in is None else b_in[e])),
                                            w_out[e], None if b_out is None else b_out[e]), [n[e] for n in norms])
                for e, block in enumerate(grouped.split(sizes))
            ])  # (S, D)
        # Without autograd each expert writes its block straight into one buffer (no
        # concatenation) and experts without tokens are skipped.
        out = grouped.new_empty(grouped.shape[0], self.d_model)  # (S, D)
        start = 0
        for e, size in enumerate(sizes):
            if size == 0:
                continue
            end = start + size
            h = F.linear(grouped[start:end], w_in[e], None if b_in is None else b_in[e])  # (n_e, [2*]hidden)
            if b_out is None:
                torch.mm(self.hidden_activation(h), w_out[e].t(), out=out[start:end])
            else:
                torch.addmm(b_out[e], self.hidden_activation(h), w_out[e].t(), out=out[start:end])
            if norms:
                out[start:end] = self.expert_normed(out[start:end], [n[e] for n in norms])
            start = end
        return out

    def expert_normed(self, y: Tensor, weights: list[Tensor]) -> Tensor:
        """An expert's output ``y`` ``(n_e, D)`` through its own norm (``weights``: its slices of the norm stacks)."""
        if not self._expert_norm:
            return y
        return torch.func.functional_call(self._expert_norm[0], dict(zip(self._expert_norm_params, weights)), (y,))

    def expert_parallel(self, group: Any) -> None:
        """Keep this process' share of whole experts, computed by dispatch (:mod:`specformer.model.expert_parallel`).

        The router, the shared experts, their gate and the output norm stay whole on every process.
        """
        keep_local_experts(self, self.expert_stacks(), group)
        self.expert_group = group

    def run_shared(self, tokens: Tensor) -> Tensor:
        """The shared experts on ``tokens`` ``(N, D)``; DeepSeek-V4 clamps them as it clamps the routed ones."""
        assert self.shared is not None
        if self.swiglu_limit is None or self.swiglu_style != "silu":
            return self.shared(tokens)
        return self.shared.down(self.hidden_activation(self.shared.gate_up(tokens)))

    def hidden_activation(self, h: Tensor) -> Tensor:
        """An expert's hidden activation from its input projection ``h`` (``[gate; up]`` when gated)."""
        if not self.gated:
            return self.activation(h)
        gate, up = h.chunk(2, dim=-1)  # (n_e, hidden) each
        if self.swiglu_limit is None:
            return self.activation(gate) * up
        # gpt-oss: the gate clamped from above, the up projection both ways and shifted by one.
        gate = gate.clamp(max=self.swiglu_limit)
        up = up.clamp(min=-self.swiglu_limit, max=self.swiglu_limit)
        if self.swiglu_style == "silu":  # DeepSeek-V4: the same clamps around a plain SwiGLU
            return self.activation(gate) * up
        return (up + 1) * (gate * torch.sigmoid(self.swiglu_alpha * gate))

    def active_parameters(self) -> int:
        """Weights one token's forward multiplies by: the router, ``top_k`` experts and the shared experts."""
        expert_params = [p for p in (getattr(self, name) for name in self.expert_stacks()) if p is not None]
        per_expert = sum(p.numel() for p in expert_params) // self.n_experts
        total = sum(p.numel() for p in self.router.parameters()) + self.top_k * per_expert
        for module in (self.shared, self.shared_gate, self.output_norm, self.shared_norm):
            if module is not None:
                total += sum(p.numel() for p in module.parameters())
        return total + (self.output_bias.numel() if self.output_bias is not None else 0)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        # The router and the shared experts initialise themselves (Decoder.init_weights reaches every module).
        nn.init.normal_(self.experts_in, std=std)
        nn.init.normal_(self.experts_out, std=residual_std)  # feeds the residual stream
        for bias in (self.experts_in_bias, self.experts_out_bias, self.output_bias):
            if bias is not None:
                nn.init.zeros_(bias)
        if self.shared_gate is not None:
            nn.init.normal_(self.shared_gate.weight, std=std)
        if self._expert_norm:  # every expert's norm as the norm initialises itself
            template = self._expert_norm[0]
            template_init = getattr(template, "init_weights", None)
            if template_init is not None:
                template_init(std=std, residual_std=residual_std)
            with torch.no_grad():
                for stacked, (_, param) in zip(self.expert_norm_names, template.named_parameters()):
                    getattr(self, stacked).copy_(param.detach().expand_as(getattr(self, stacked)))

    def extra_repr(self) -> str:
        return (f"n_experts={self.n_experts}, top_k={self.top_k}, hidden={self.hidden}, gated={self.gated}, "
                f"expert_bias={self.experts_in_bias is not None}, swiglu_limit={self.swiglu_limit}, "
                f"swiglu_style={self.swiglu_style}, shared_combine={self.shared_combine}"
                + (f", expert_norm={type(self._expert_norm[0]).__name__}" if self._expert_norm else ""))


def _per_expert(stack: Any) -> Any:
    """Expert ``e``'s slice of a stacked weight as ``result[e]``.

    A parameter is unbound once, so backward assembles its gradient in one piece; indexing
    it expert by expert would make backward write a full-size zero gradient per expert. A
    quantized stack (not a tensor) is indexed as it is.
    """
    return stack.unbind(0) if isinstance(stack, Tensor) else stack


def _combine(sorted_out: Tensor, *, token_of: Tensor, order: Tensor, n_tokens: int) -> Tensor:
    """Each token's sum of its weighted slot outputs ``(N, D)`` from the slots sorted by expert.

    Deterministic on every device, and a token's sum never depends on the other tokens (a
    batch row equals the row run alone). On the CPU ``index_add_`` is exact in that sense:
    it adds each row's contributions one after another in slot order (for a token, its
    experts in ascending order), whether it runs as scatter_add's serial loop or its
    sorted, row-parallel path, never with atomics; it reads each slot once, where the copy
    back to slot order below reads and writes everything twice. Elsewhere (CUDA adds with
    atomics, in no fixed order), and when compiling (the generated scatter may too), the
    slots go back to slot order by one copy and each token sums its ``k`` rows.
    """
    if sorted_out.device.type == "cpu" and not torch.compiler.is_compiling():
        out = sorted_out.new_zeros(n_tokens, sorted_out.shape[-1])  # (N, D)
        return out.index_add_(0, token_of, sorted_out)
    per_slot = torch.empty_like(sorted_out).index_copy_(0, order, sorted_out)  # (N*k, D), slot order
    return per_slot.view(n_tokens, -1, sorted_out.shape[-1]).sum(dim=1)  # (N, D)


def load_balancing_loss(probs: Tensor, experts: Tensor, n_experts: int) -> Tensor:
    """Switch Transformer's auxiliary loss as Mixtral uses it: ``E * sum_e f_e * P_e``.

    ``f_e`` is the number of routing slots sent to expert ``e`` over the number of tokens
    (the shares sum to ``top_k``); ``P_e`` the mean router probability of ``e``. Equals
    ``top_k`` when the load is perfectly uniform. Gradients flow through ``P_e`` only.
    """
    n_tokens = probs.shape[0]
    slots = experts.flatten()
    counts = torch.zeros(n_experts, dtype=probs.dtype, device=probs.device)
    counts = counts.scatter_add(0, slots, torch.ones_like(slots, dtype=probs.dtype))
    return n_experts * torch.sum(counts / n_tokens * probs.mean(dim=0))
