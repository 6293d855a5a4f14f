"""The settings of the residual streams, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field, field_validator

from specformer.registry.params import Params, Sized


class SingleStreamParams(Params):
    """One residual stream: each sublayer reads it and its output is added, ``x = x + f(x)`` (He et al. 2016).

    What every block has unless the spec says otherwise; it has no weights.
    """

    def sized(self) -> Sized:
        return Sized(parameters=0, n_streams=1, connection=Sized(parameters=0, n_streams=1))


class HyperConnectionsParams(Params):
    """Manifold-constrained hyper-connections (mHC): ``n_streams`` parallel residual streams mixed by learned weights.

    The embeddings are copied into N streams ``(B, T, N, d_model)``. Before each sublayer,
    weights are computed from the streams themselves: the N streams flattened, RMS-normalised
    (no weight) and projected by ``fn`` to ``N + N + N*N`` numbers, each group times its own
    ``scale`` plus ``base``. Then ``pre = sigmoid(.) + eps`` mixes the streams into the
    sublayer's input, ``post = 2 sigmoid(.)`` spreads its output over the streams, and
    ``comb = softmax(.) + eps`` (rows), made doubly stochastic by ``sinkhorn_iterations``
    Sinkhorn-Knopp steps (column, then rows and columns in turn), mixes the streams among
    themselves: ``stream_k = post_k * out + sum_j comb[j, k] stream_j``. Before the final
    norm a head collapses the streams with its own ``pre`` weights. The weights are computed
    in float32 (float64 stays float64). This is DeepSeek-V4's formulation (transformers'
    ``DeepseekV4HyperConnection``, ``hc_mult``, ``hc_sinkhorn_iters``, ``hc_eps``) of mHC
    (Xie et al. 2026, arXiv:2512.24880), which constrains the hyper-connections of Zhu et
    al. 2024 (arXiv:2409.19606) to doubly stochastic mixing so the streams' scale cannot grow
    layer after layer.
    """

    n_streams: int = Field(default=4, ge=2, description="Number of parallel residual streams N (DeepSeek-V4's hc_mult).")
    sinkhorn_iterations: int = Field(
        default=20, ge=1, description="Sinkhorn-Knopp iterations making the stream mixing doubly stochastic (hc_sinkhorn_iters).",
    )
    eps: float = Field(default=1e-6, ge=0, description="Added to pre and comb weights and to each Sinkhorn denominator (hc_eps).")
    norm_eps: float = Field(default=1e-6, gt=0, description="Epsilon of the weightless RMS norm over the flattened streams (rms_norm_eps).")

    @field_validator("n_streams", mode="before")
    @classmethod
    def _more_than_one(cls, value: object) -> object:
        # Checked before the bound, so that one stream gets the way out rather than "should be >= 2".
        if value == 1 and not isinstance(value, bool):
            raise ValueError("one stream is the plain residual (mixing one stream with itself is the identity): "
                             "use residual: single, or n_streams 2 or more")
        return value

    def sized(self, *, d_model: int) -> Sized:
        n = self.n_streams
        # The head: fn (N, N * D), base (N,), scale (1,); each connection: fn (N(N+2), N * D), base (N(N+2),), scale (3,).
        head = n * n * d_model + n + 1
        per_connection = n * (n + 2) * n * d_model + n * (n + 2) + 3
        connection = Sized(parameters=per_connection, n_streams=n, name="HyperConnection")
        return Sized(parameters=head, n_streams=n, connection=connection)
