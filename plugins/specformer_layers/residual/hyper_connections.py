"""Manifold-constrained hyper-connections (mHC; Xie et al. 2026, as DeepSeek-V4 uses them).

The residual stream is ``N`` parallel streams ``(B, T, N, D)``. Every place where a
sublayer joins the stream has a :class:`HyperConnection`, whose weights are computed per
token from the streams: ``pre`` reads a mix of the streams for the sublayer, ``post``
spreads its output over them, and ``comb``, a doubly stochastic ``N x N`` matrix
(:func:`sinkhorn`), mixes the streams among themselves. :class:`HyperConnections` copies
the embeddings into the streams and, before the final norm, collapses them with its own
``pre`` weights. Formulas, parameter shapes and the float32 computation follow
transformers' ``DeepseekV4HyperConnection`` and ``DeepseekV4HyperHead`` one to one, so
their weights load unchanged (``attn_hc``/``ffn_hc`` -> ``attention_residual``/``ffn_residual``,
``hc_head.hc_*`` -> ``residual.*``); see :class:`HyperConnectionsParams`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer.model.residual import ResidualConnection, ResidualStream
from specformer_layers.residual.params import HyperConnectionsParams


def sinkhorn(comb: Tensor, *, iterations: int, eps: float) -> Tensor:
    """Sinkhorn-Knopp on positive ``(..., N, N)`` matrices: columns, then rows and columns ``iterations - 1`` times.

    Each step divides by the sums plus ``eps`` (DeepSeek-V4's order and floor), so the
    result is doubly stochastic up to the last rows' normalisation being one step old.
    """
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iterations - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return comb


def _weights_dtype(stream: Tensor) -> torch.dtype:
    """float32 for lower precisions (as DeepSeek-V4 computes them), float64 stays float64."""
    return torch.promote_types(stream.dtype, torch.float32)


def _normed_flat(stream: Tensor, eps: float) -> Tensor:
    """The N streams of each token side by side ``(B, T, N * D)``, RMS-normalised without a weight."""
    flat = stream.flatten(2).to(_weights_dtype(stream))  # (B, T, N * D)
    return F.rms_norm(flat, (flat.shape[-1],), None, eps)


def _collapse(pre: Tensor, stream: Tensor) -> Tensor:
    """``sum_j pre_j * stream_j``: ``(B, T, N)`` weights over ``(B, T, N, D)`` streams, back in the stream's dtype."""
    return (pre.unsqueeze(-1) * stream).sum(dim=2).to(stream.dtype)  # (B, T, D)


class HyperConnection(ResidualConnection):
    """One sublayer's connection to the N streams: ``pre``, ``post`` and ``comb`` from ``fn``, ``base``, ``scale``.

    ``fn`` ``(N * (N + 2), N * D)`` projects the normalised streams to the pre (N), post (N)
    and comb (N * N) logits, in that order; ``base`` ``(N * (N + 2),)`` is added to them and
    ``scale`` ``(3,)`` multiplies each group (DeepSeek-V4's ``attn_hc``/``ffn_hc``).
    """

    def __init__(self, params: HyperConnectionsParams, *, d_model: int) -> None:
        super().__init__()
        self.n_streams = n = params.n_streams
        self.sinkhorn_iterations = params.sinkhorn_iterations
        self.eps = params.eps
        self.norm_eps = params.norm_eps
        self.fn = nn.Parameter(torch.empty(n * (n + 2), n * d_model))
        self.base = nn.Parameter(torch.empty(n * (n + 2)))
        self.scale = nn.Parameter(torch.empty(3))
        self.init_weights(std=0.02, residual_std=0.02)

    def read(self, stream: Tensor) -> tuple[Tensor, Any]:
        """The sublayer's input ``(B, T, D)``, and ``(post (B, T, N), comb (B, T, N, N))`` for :meth:`write`."""
        n = self.n_streams
        dtype = _weights_dtype(stream)
        logits = F.linear(_normed_flat(stream, self.norm_eps), self.fn.to(dtype))  # (B, T, N * (N + 2))
        pre_w, post_w, comb_w = logits.split([n, n, n * n], dim=-1)
        pre_b, post_b, comb_b = self.base.to(dtype).split([n, n, n * n])
        pre_s, post_s, comb_s = self.scale.to(dtype).unbind(0)
        pre = torch.sigmoid(pre_w * pre_s + pre_b) + self.eps
        post = 2 * torch.sigmoid(post_w * post_s + post_b)
        comb_w = comb_w.unflatten(-1, (n, n))  # (B, T, N, N)
        comb = torch.softmax(comb_w * comb_s + comb_b.view(n, n), dim=-1) + self.eps
        comb = sinkhorn(comb, iterations=self.sinkhorn_iterations, eps=self.eps)
        return _collapse(pre, stream), (post, comb)

    def write(self, stream: Tensor, *outputs: Tensor, mix: Any = None) -> Tensor:
        """``stream_k = post_k * out + sum_j comb[j, k] * stream_j`` (``out``: the outputs summed), in the stream's dtype."""
        post, comb = mix
        out = outputs[0]
        for more in outputs[1:]:
            out = out + more
        dtype = stream.dtype
        spread = post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2)  # (B, T, N, D)
        return spread + torch.matmul(comb.to(dtype).transpose(-1, -2), stream)

    def init_weights(self, *, std: float, residual_std: float) -> None:
        """DeepSeek-V4's: ``fn`` normal, ``base`` zero, ``scale`` one (streams start evenly mixed)."""
        nn.init.normal_(self.fn, mean=0.0, std=std)
        nn.init.zeros_(self.base)
        nn.init.ones_(self.scale)

    def extra_repr(self) -> str:
        return (f"n_streams={self.n_streams}, sinkhorn_iterations={self.sinkhorn_iterations}, eps={self.eps}, "
                f"norm_eps={self.norm_eps}")


class HyperConnections(ResidualStream):
    """N streams (:class:`HyperConnectionsParams`): the embeddings copied in, collapsed by a head before the final norm.

    The head's ``fn`` ``(N, N * D)``, ``base`` ``(N,)`` and ``scale`` ``(1,)`` give the
    collapsing weights ``sigmoid(fn(normed streams) * scale + base) + eps`` (DeepSeek-V4's
    ``hc_head``); each block's connections are made by :meth:`connection`.
    """

    Params = HyperConnectionsParams

    def __init__(self, params: HyperConnectionsParams | None = None, *, d_model: int) -> None:
        params = params if params is not None else HyperConnectionsParams()
        super().__init__()
        self.params = params
        self.d_model = d_model
        self.n_streams = n = params.n_streams
        self.fn = nn.Parameter(torch.empty(n, n * d_model))
        self.base = nn.Parameter(torch.empty(n))
        self.scale = nn.Parameter(torch.empty(1))
        self.init_weights(std=0.02, residual_std=0.02)

    def expand(self, x: Tensor) -> Tensor:
        return x.unsqueeze(2).expand(-1, -1, self.n_streams, -1).contiguous()  # (B, T, N, D)

    def collapse(self, stream: Tensor) -> Tensor:
        dtype = _weights_dtype(stream)
        logits = F.linear(_normed_flat(stream, self.params.norm_eps), self.fn.to(dtype))  # (B, T, N)
        pre = torch.sigmoid(logits * self.scale.to(dtype) + self.base.to(dtype)) + self.params.eps
        return _collapse(pre, stream)

    def connection(self) -> HyperConnection:
        return HyperConnection(self.params, d_model=self.d_model)

    def describe(self) -> str:
        return f"mhc: {self.n_streams} streams, Sinkhorn {self.params.sinkhorn_iterations} iterations"

    def init_weights(self, *, std: float, residual_std: float) -> None:
        """DeepSeek-V4's: ``fn`` normal, ``base`` zero, ``scale`` one."""
        nn.init.normal_(self.fn, mean=0.0, std=std)
        nn.init.zeros_(self.base)
        nn.init.ones_(self.scale)

    def extra_repr(self) -> str:
        p = self.params
        return (f"d_model={self.d_model}, n_streams={self.n_streams}, sinkhorn_iterations={p.sinkhorn_iterations}, "
                f"eps={p.eps}, norm_eps={p.norm_eps}")


__all__ = ["HyperConnection", "HyperConnections", "sinkhorn"]
