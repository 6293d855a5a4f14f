"""The settings of the mLSTM token mixer, importable without torch (listing components reads only these)."""

from __future__ import annotations

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized


class MLSTMParams(Params):
    """mLSTM: a matrix memory with exponential input and forget gates, max-stabilised (Beck et al. 2024, xLSTM).

    Each of ``n_heads`` heads keeps a memory ``C`` (``qk_dim / n_heads x v_dim / n_heads``), a
    normaliser ``n`` and a stabiliser ``m``. Per token, with the gate pre-activations ``i`` and
    ``f`` (one per head, each soft-capped ``cap tanh(x / cap)`` by ``gate_soft_cap``):
    ``m' = max(logsigmoid(f) + m, i)``, ``C' = exp(logsigmoid(f) + m - m') C + exp(i - m') k vᵀ``,
    ``n' = exp(logsigmoid(f) + m - m') n + exp(i - m') k`` and the head's output
    ``h = q C' / (max(|q · n'|, exp(-m')) + eps)`` with ``q`` scaled by ``1 / sqrt(qk head dim)``.
    The heads' outputs are layer-normalised per head (weight over all ``v_dim`` channels, eps
    ``norm_eps``), multiplied by ``sigmoid(o)`` of the output-gate projection and projected back
    (xLSTM-7B's mLSTM layer; Beck et al. 2025, *xLSTM 7B*, arXiv:2503.13427). Without a cache
    (training, prefill) the recurrence runs in chunks of ``chunk`` tokens (within a chunk as
    gated, stabilised attention; across chunks through the state); cached forwards of a few
    tokens (decoding) run token by token. Both give the same outputs.
    """

    n_heads: int = Field(gt=0, description="Heads: each keeps its own matrix memory, normaliser and stabiliser.")
    qk_dim: int | None = Field(default=None, gt=0, description="Query and key channels over all heads; default "
                                                              "d_model / 2 (xLSTM's qk_dim_factor 0.5).")
    v_dim: int | None = Field(default=None, gt=0, description="Value (and output gate) channels over all heads; "
                                                             "default d_model.")
    bias: bool = Field(default=False, description="Biases on the q, k, v, output-gate and out projections and the "
                                                  "per-head norm (xLSTM's use_bias); the gate projections always "
                                                  "have one.")
    gate_soft_cap: float | None = Field(default=15.0, gt=0, description="Soft cap cap*tanh(x/cap) on the input and "
                                                                        "forget gate pre-activations; null: none.")
    norm_eps: float = Field(default=1e-6, gt=0, description="Epsilon of the per-head layer norm of the outputs.")
    eps: float = Field(default=1e-6, gt=0, description="Added to the normaliser max(|q . n|, exp(-m)) before dividing.")
    chunk: int = Field(default=64, gt=0, description="Tokens per chunk of the chunked (parallel) form (speed and "
                                                     "memory only; xLSTM's chunk_size).")

    @model_validator(mode="after")
    def _heads_divide(self) -> MLSTMParams:
        for name in ("qk_dim", "v_dim"):
            width = getattr(self, name)
            if width is not None and width % self.n_heads:
                raise ValueError(f"mlstm: n_heads ({self.n_heads}) must divide {name} ({width})")
        return self

    def dims(self, d_model: int) -> tuple[int, int]:
        """``(qk_dim, v_dim)`` for ``d_model``; ValueError when ``n_heads`` cannot split a default."""
        qk = self.qk_dim if self.qk_dim is not None else d_model // 2
        v = self.v_dim if self.v_dim is not None else d_model
        for name, width in (("qk_dim", qk), ("v_dim", v)):
            if width < self.n_heads or width % self.n_heads:
                raise ValueError(f"mlstm: n_heads ({self.n_heads}) must divide {name} ({width} for d_model "
                                 f"{d_model}); give {name} explicitly")
        return qk, v

    def sized(self, *, d_model: int) -> Sized:
        qk, v = self.dims(d_model)
        bias = int(self.bias)
        projections = (2 * qk + 2 * v) * (d_model + bias)  # q, k, v, output gate
        gates = 2 * self.n_heads * (d_model + 1)  # input and forget gates, always biased
        norm = v * (1 + bias)
        out = v * d_model + bias * d_model
        return Sized(parameters=projections + gates + norm + out, n_heads=self.n_heads, n_kv_heads=self.n_heads,
                     head_dim=qk // self.n_heads, keeps_state=True)


__all__ = ["MLSTMParams"]
