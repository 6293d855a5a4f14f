"""The settings of Lightning attention, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field

from specformer.registry.params import Params, Sized
from specformer_layers.ffn.params import Activation


class LightningAttentionParams(Params):
    """Lightning attention: linear attention whose matrix memory decays at a fixed rate per head (MiniMax-01).

    Each of ``n_heads`` heads keeps a state ``S`` (``head_dim x head_dim``); per token
    ``S <- exp(-s) S + k^T v`` and the output is ``q S``, with queries, keys and values the
    ``activation`` (SiLU) of one projection and no softmax or scaling (Qin et al. 2024,
    *Lightning Attention-2*, arXiv:2401.04658; MiniMax 2025, *MiniMax-01*, arXiv:2501.08313).
    The decay rate ``s`` is the ALiBi-style slope of head ``h`` (``2^(-8 (h + 1) / n_heads)``)
    times ``1 - l / (L - 1) + 1e-5`` for layer ``l`` of ``L``: deeper layers decay more slowly,
    the last barely at all (MiniMax's formula, ``1e-5`` added to ``L - 1`` as it does). The
    heads' outputs, concatenated, go through one RMSNorm (eps ``norm_eps``) over all
    ``n_heads * head_dim`` channels, are multiplied by ``sigmoid(gate x)`` and projected back.
    Without a cache (training, prefill) the recurrence runs in blocks of ``chunk`` tokens
    (within a block as masked, decayed attention; across blocks through the state); cached
    forwards of a few tokens (decoding) run token by token. The state is the only thing a
    sequence keeps, whatever the context.
    """

    n_heads: int = Field(gt=0, description="Heads: each keeps its own head_dim x head_dim state and decay rate.")
    head_dim: int | None = Field(default=None, gt=0, description="Channels per head; default d_model / n_heads.")
    activation: Activation = Field(default="silu", description="Applied to the queries, keys and values (MiniMax's "
                                                                "hidden_act).")
    norm_eps: float = Field(default=1e-6, gt=0, description="Epsilon of the RMSNorm over the heads' joined outputs.")
    chunk: int = Field(default=64, gt=0, description="Tokens per block of the blocked (parallel) form (speed and "
                                                     "memory only; MiniMax's block_size).")

    def dim(self, d_model: int) -> int:
        """Channels per head for ``d_model``; ValueError when ``n_heads`` cannot split it."""
        if self.head_dim is not None:
            return self.head_dim
        if d_model % self.n_heads:
            raise ValueError(f"lightning: n_heads ({self.n_heads}) must divide d_model ({d_model}) unless head_dim "
                             f"is given")
        return d_model // self.n_heads

    def sized(self, *, d_model: int) -> Sized:
        inner = self.n_heads * self.dim(d_model)
        parameters = 3 * d_model * inner + d_model * inner + inner + inner * d_model  # qkv, gate, norm, out
        return Sized(parameters=parameters, n_heads=self.n_heads, n_kv_heads=self.n_heads, head_dim=self.dim(d_model),
                     keeps_state=True)


__all__ = ["LightningAttentionParams"]
