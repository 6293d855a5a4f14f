"""Lightning attention as a block's token mixer (MiniMax-Text-01): :class:`LightningAttentionParams`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from specformer.model.state import StateSlots

from specformer_layers.ffn.activations import ACTIVATIONS
from specformer_layers.mixers.lightning_params import LightningAttentionParams
from specformer_layers.mixers.recurrent import MixerRun, RecurrentMixer
from specformer_layers.mixers.ssd import working_dtype
from specformer_layers.norms.params import RMSNormParams
from specformer_layers.norms.rmsnorm import RMSNorm

#: A cached forward of at most this many tokens runs token by token (decoding); longer ones by blocks.
RECURRENT_MAX_TOKENS = 16
#: MiniMax adds this to ``L - 1`` (so that one layer does not divide by zero) and to the depth factor.
DEPTH_EPS = 1e-5


def decay_rates(n_heads: int, *, layer_index: int, n_layers: int) -> list[float]:
    """Each head's decay rate ``s`` (the state is multiplied by ``exp(-s)`` per token) in layer ``layer_index`` of ``n_layers``.

    The ALiBi slopes ``2^(-8 (h + 1) / n_heads)`` scaled by ``1 - l / (L - 1) + 1e-5``: the
    first layer forgets fastest, the last keeps almost everything (MiniMax-01).
    """
    depth = 1 - layer_index / (n_layers - 1 + DEPTH_EPS) + DEPTH_EPS
    base = 2.0 ** (-8.0 / n_heads)
    return [base ** (h + 1) * depth for h in range(n_heads)]


@dataclass(frozen=True)
class LinearRun:
    """The decayed linear attention's outputs ``(B, H, T, dv)``, its state after ``(B, H, dk, dv)`` and, when asked, after each token ``(B, T, H, dk, dv)``."""

    out: Tensor
    state: Tensor
    steps: Tensor | None = None


def decayed_linear_attention_recurrent(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *, state: Tensor | None = None,
                                       steps: bool = False) -> LinearRun:
    """``S <- exp(g) S + k^T v``, ``o = q S`` token by token; ``q``, ``k`` ``(B, H, T, dk)``, ``v`` ``(B, H, T, dv)``, ``g`` ``(B, H, T)``."""
    B, H, T, dk = k.shape
    s = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state.to(q.dtype)
    outs, kept = [], []
    for t in range(T):
        s = log_decay[:, :, t, None, None].exp() * s + k[:, :, t, :, None] * v[:, :, t, None, :]  # (B, H, dk, dv)
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, t], s))
        if steps:
            kept.append(s)
    out = torch.stack(outs, dim=2) if outs else v.new_zeros(v.shape)  # (B, H, T, dv)
    return LinearRun(out=out, state=s, steps=torch.stack(kept, dim=1) if steps and kept else None)


def decayed_linear_attention_blocked(q: Tensor, k: Tensor, v: Tensor, log_decay: Tensor, *, state: Tensor | None = None,
                                     chunk: int) -> LinearRun:
    """The same recurrence ``chunk`` tokens at a time (Lightning Attention-2's blocks), for any length.

    Within a block, token ``i`` reads token ``j <= i`` as attention weighted by the decay between
    them, ``(q_i . k_j) exp(G_i - G_j)`` (``G`` the running sum of the log-decays in the block);
    what came before the block it reads from the state, decayed by ``exp(G_i)``; the state then
    decays by the whole block and takes the block's keys and values, each decayed to its end.
    A per-token log-decay (not one per head) lets padding tokens decay nothing.
    """
    B, H, T, dk = k.shape
    s = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state.to(q.dtype)
    outs = []
    for start in range(0, T, chunk):
        qc, kc, vc = (t[:, :, start:start + chunk] for t in (q, k, v))  # (B, H, c, d)
        g = log_decay[:, :, start:start + chunk].cumsum(dim=-1)  # (B, H, c)
        c = g.shape[-1]
        causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
        # exp of a masked difference: never exp(positive) for j > i, which may overflow.
        between = torch.where(causal, g[..., :, None] - g[..., None, :], float("-inf")).exp()  # (B, H, c, c)
        intra = (qc @ kc.transpose(-1, -2) * between) @ vc  # (B, H, c, dv)
        inter = (qc * g[..., None].exp()) @ s  # (B, H, c, dv)
        outs.append(intra + inter)
        to_end = (g[..., -1:] - g).exp()  # (B, H, c): each token's decay to the block's end
        s = g[..., -1, None, None].exp() * s + (kc * to_end[..., None]).transpose(-1, -2) @ vc  # (B, H, dk, dv)
    out = torch.cat(outs, dim=2) if outs else v.new_zeros(v.shape)
    return LinearRun(out=out, state=s)


class LightningAttention(RecurrentMixer):
    """Lightning attention token mixer: :class:`LightningAttentionParams`.

    Module parameters (the names weight mappings rely on), with ``H`` heads of ``d`` channels:

    - ``qkv``: Linear ``d_model -> 3 H d``, no bias, rows per head ``[q_h; k_h; v_h]``
      (head 0's query, key and value rows, then head 1's: MiniMax's ``qkv_proj`` order);
    - ``gate``: Linear ``d_model -> H d``, no bias: the sigmoid output gate;
    - ``norm``: RMSNorm over the ``H d`` joined outputs, ``norm.weight`` ``(H d,)``;
    - ``out``: Linear ``H d -> d_model``, no bias.

    Public facts: ``n_heads`` = ``n_kv_heads`` = ``H``, ``head_dim`` = ``d``, ``decay_rates``
    (one per head, set by the layer's depth), ``window`` and ``cache_slots`` None (nothing is
    kept per token), ``state_slots`` ``recurrent`` ``(H, d, d)``, ``uses_positions`` False.
    """

    Params = LightningAttentionParams

    def __init__(self, params: LightningAttentionParams, *, d_model: int, layer_index: int = 0, n_layers: int = 1) -> None:
        super().__init__()
        heads, dim = params.n_heads, params.dim(d_model)
        # The public facts others read (specformer.model.attention.AttentionLayer, specformer.model.state).
        self.layer_index = layer_index
        self.n_heads = heads
        self.n_kv_heads = heads
        self.head_dim = dim
        self.scan_chunk = params.chunk  # not "chunk": that names chunked attention's reach (reach_of)
        self.act = ACTIVATIONS[params.activation]
        # Floats, not a buffer: they follow from the layer's place alone, so no checkpoint or device move touches them.
        self.decay_rates = tuple(decay_rates(heads, layer_index=layer_index, n_layers=n_layers))
        self.state_slots = StateSlots((("recurrent", (heads, dim, dim)),))
        # Per token beyond the projections: per head the decay, the write and the read of a d x d state.
        self.recurrent_flops_per_token = 5 * heads * dim * dim

        self.qkv = nn.Linear(d_model, 3 * heads * dim, bias=False)
        self.gate = nn.Linear(d_model, heads * dim, bias=False)
        self.norm = RMSNorm(RMSNormParams(eps=params.norm_eps), dim=heads * dim)
        self.out = nn.Linear(heads * dim, d_model, bias=False)

    # -- forward ----------------------------------------------------------------------------

    def run(self, x: Tensor, *, state: dict[str, Tensor] | None = None, padding: Tensor | None = None,
            steps: bool = False) -> MixerRun:
        """The layer on ``x`` ``(B, T, D)`` from ``state`` (zeros when None): output, state after, steps if asked.

        ``padding`` ``(B,)``: tokens opening each row that must leave the state as it was (they
        write nothing and decay nothing). A cached forward of at most :data:`RECURRENT_MAX_TOKENS`
        tokens (decoding) runs token by token, as does one that keeps steps; anything else by blocks.
        """
        recurrent = steps or (state is not None and x.shape[1] <= RECURRENT_MAX_TOKENS)
        B, T, _ = x.shape
        H, d = self.n_heads, self.head_dim
        work = working_dtype(x.dtype)
        qkv = self.act(self.qkv(x)).reshape(B, T, H, 3, d).to(work)  # per head [q; k; v]
        q, k, v = (qkv[:, :, :, i].transpose(1, 2) for i in range(3))  # (B, H, T, d) each
        rates = torch.tensor(self.decay_rates, dtype=work, device=x.device)  # (H,)
        log_decay = (-rates)[None, :, None].expand(B, H, T)  # (B, H, T)
        if padding is not None:  # padding writes nothing and decays nothing: the state stays as it was
            real = (torch.arange(T, device=x.device)[None, :] >= padding[:, None])[:, None, :]  # (B, 1, T)
            log_decay = torch.where(real, log_decay, 0.0)
            k = k * real[..., None]
        held = None if state is None else state["recurrent"]
        if recurrent:
            run = decayed_linear_attention_recurrent(q, k, v, log_decay, state=held, steps=steps)
        else:
            run = decayed_linear_attention_blocked(q, k, v, log_decay, state=held, chunk=self.scan_chunk)
        o = run.out.transpose(1, 2).reshape(B, T, H * d).to(x.dtype)  # (B, T, H d)
        y = self.norm(o) * torch.sigmoid(self.gate(x))
        return MixerRun(out=self.out(y), state={"recurrent": run.state},
                        steps={"recurrent": run.steps} if steps else None)

    # -- facts and initialisation ---------------------------------------------------------------

    def describe_kernel(self, *, bias: bool = False) -> str:
        """The kernel this layer runs, in words (``specformer summary``); ``bias`` changes nothing here."""
        return (f"torch decayed linear attention by blocks (chunk {self.scan_chunk}); token by token for cached "
                f"forwards of <= {RECURRENT_MAX_TOKENS} tokens")

    def extra_repr(self) -> str:
        return f"n_heads={self.n_heads}, head_dim={self.head_dim}, chunk={self.scan_chunk}, layer_index={self.layer_index}"

    def init_weights(self, *, std: float, residual_std: float) -> None:
        for linear in (self.qkv, self.gate):
            nn.init.normal_(linear.weight, std=std)
        nn.init.normal_(self.out.weight, std=residual_std)  # feeds the residual stream
        self.norm.init_weights(std=std, residual_std=residual_std)


__all__ = ["LightningAttention", "decay_rates", "decayed_linear_attention_blocked", "decayed_linear_attention_recurrent"]
