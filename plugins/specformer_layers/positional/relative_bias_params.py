"""The settings of the T5-style bucketed relative position bias, importable without torch."""

from __future__ import annotations

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized


class RelativeBiasParams(Params):
    """A learned score bias per head for each bucket of key-minus-query distance (T5, Raffel et al. 2020).

    The distance ``d = k - q`` of a key from its query falls in one of ``n_buckets`` buckets.
    Unidirectional (a decoder: T5's decoder, the default) only keys at or before the query
    count, ``n = max(-d, 0)``, over all ``n_buckets``; ``bidirectional`` (T5's encoder,
    CPM-Ant) gives keys after the query the upper half of the buckets and both sides
    ``n_buckets / 2`` each, ``n = |d|``. Of a side's ``N`` buckets, the first ``N / 2``
    are the exact distances ``0 .. N/2 - 1``; a larger distance gets bucket
    ``N/2 + floor(log(n / (N/2)) / log(max_distance / (N/2)) * (N - N/2))``, at most
    ``N - 1``, so buckets widen logarithmically and every distance from ``max_distance``
    on shares the last. The table of ``n_buckets x n_heads`` biases is one per model (T5
    shares it across layers); a layer may name a scheme of its own (``model.layers[].
    positional``). Computed from absolute query and key positions, it works through a KV
    cache and with SDPA (as an additive float mask).
    """

    n_buckets: int = Field(default=32, ge=2, description="Buckets of distance (T5: 32); even when bidirectional.")
    max_distance: int = Field(default=128, ge=1, description="Distance from which all keys share the last bucket "
                                                             "(T5: 128).")
    bidirectional: bool = Field(default=False, description="Keys after the query get buckets of their own (T5's "
                                                           "encoder, CPM-Ant); a decoder's default is one-sided.")

    @model_validator(mode="after")
    def _fits(self) -> "RelativeBiasParams":
        side = self.n_buckets // 2 if self.bidirectional else self.n_buckets
        if self.bidirectional and self.n_buckets % 2:
            raise ValueError(f"relative_bias: bidirectional needs an even n_buckets (half for each side), "
                             f"got {self.n_buckets}")
        if side < 2:
            raise ValueError(f"relative_bias: each side needs at least 2 buckets, got n_buckets {self.n_buckets}"
                             f"{' (bidirectional)' if self.bidirectional else ''}")
        if self.max_distance <= side // 2:
            raise ValueError(f"relative_bias: max_distance must exceed the {side // 2} exact distances of a side "
                             f"(n_buckets {self.n_buckets}{', bidirectional' if self.bidirectional else ''}), "
                             f"got {self.max_distance}")
        return self

    def sized(self, *, n_heads: int) -> Sized:
        if n_heads < 1:
            raise ValueError(f"relative_bias needs at least one head, got n_heads={n_heads}")
        return Sized(parameters=self.n_buckets * n_heads)
