"""The settings of the block-pooled indexer, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from specformer.registry.params import Params, Sized


class BlockPooledIndexerParams(Params):
    """Block-sparse attention's selector: each query reads whole blocks of ``block_size`` keys.

    The keys of a layer are cut into blocks by position (block ``j``: positions
    ``j*block_size`` to ``(j+1)*block_size - 1``). Each block is summarised by the mean of
    its keys (those of key head 0, after norm and rotation, as attention reads them; a key
    the query may not read counts as zero, the sum still divided by ``block_size``), and
    scored against query ``t`` as ``sum_h relu(q[t,h] . mean_j) / (n_heads sqrt(head_dim))``
    over the first ``n_heads`` query heads (those of key head 0). A block not yet complete at
    the query (it holds later positions) is not scored: it competes with a score of 0 (Kolibri
    1.1's indexer, transformers' ``kolibri1_1``). Each query always reads the first
    ``sink_blocks`` blocks and the ``local_blocks`` latest (its own block and the ones before),
    and the ``topk`` best-scoring of the other blocks; exact ties go to the earliest blocks.
    Within the chosen blocks the attention's mask (causal, window, padding, documents) still
    applies, so a query with at most ``sink_blocks + local_blocks + topk`` blocks attends to all
    its keys, as dense attention. It has no weights and keeps nothing in the cache: a cached
    step scores the cached keys again, so it chooses what recomputing chooses.
    """

    #: It scores the attention's own queries and keys (plain ``attention`` holds it; ``mla`` does not).
    reads_attention: ClassVar[bool] = True

    block_size: int = Field(gt=0, description="Keys per block (Kolibri 1.1's index_compression, 16).")
    topk: int = Field(gt=0, description="Blocks each query reads beside its sink and local blocks.")
    sink_blocks: int = Field(default=0, ge=0, description="Leading blocks every query reads.")
    local_blocks: int = Field(default=1, ge=0, description="Latest blocks every query reads: its own block and the "
                                                           "local_blocks - 1 before it.")
    n_heads: int | None = Field(default=None, gt=0, description="Leading query heads that score blocks (Kolibri 1.1's "
                                                                "index_num_heads); none: every query head of key head 0.")
    block: int = Field(default=64, gt=0, description="Queries scored at once (memory per step: block x blocks x head_dim).")

    def sized(self, *, d_model: int, query_dim: int, positional_dim: int) -> Sized:
        # Weightless; nothing kept per token (it rescans the attention's keys).
        return Sized(parameters=0)

    def keys_read(self) -> int:
        """The most keys one query reads (every chosen block full)."""
        return (self.topk + self.sink_blocks + self.local_blocks) * self.block_size
