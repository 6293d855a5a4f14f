"""Several token mixers on the same input, summed (Falcon-H1's attention beside Mamba-2): :class:`ParallelMixer`."""

from __future__ import annotations

import inspect
from typing import Callable

from torch import Tensor, nn

from specformer.model.attention import cache_slots_of, heads_of
from specformer.model.context import ForwardContext
from specformer.model.state import state_slots_of, uses_positions

from specformer_layers.mixers.parallel_params import ParallelMixerParams


class ParallelMixer(nn.Module):
    """``sum_i out_i * mixer_i(x * in_i)`` over sub-mixers built for the same layer: :class:`ParallelMixerParams`.

    The public facts (:class:`~specformer.model.attention.AttentionLayer`) are those of the
    sub-mixer that keeps keys per token (else the first that reads positions, else the
    first); ``cache_slots`` are that one's, ``state_slots`` the recurrent one's.
    """

    Params = ParallelMixerParams

    def __init__(self, params: ParallelMixerParams, *, d_model: int, layer_index: int = 0, n_layers: int = 1,
                 context_length: int | None = None) -> None:
        super().__init__()
        # Every sub-mixer is the same layer for the cache and the positional scheme: one layer_index.
        sizes = {"d_model": d_model, "layer_index": layer_index, "n_layers": n_layers}
        if context_length is not None:  # a sub-mixer that sizes a state by the context needs it
            sizes["context_length"] = context_length
        self.mixers = nn.ModuleList([ref.make(**sizes) for ref in params.mixers])
        count = len(self.mixers)
        self.in_multipliers = tuple(params.in_multipliers or [1.0] * count)
        self.out_multipliers = tuple(params.out_multipliers or [1.0] * count)
        params.sized(d_model=d_model, layer_index=layer_index, n_layers=n_layers)  # one cache, one state at most
        keepers = [i for i, m in enumerate(self.mixers) if cache_slots_of(m) is not None]
        recurrent = [i for i, m in enumerate(self.mixers) if state_slots_of(m) is not None]
        readers = [i for i, m in enumerate(self.mixers) if uses_positions(m)]
        lead = self.mixers[params.lead(keepers, readers)]
        self.layer_index = layer_index
        heads = heads_of(lead)
        if heads is not None:  # the lead's heads, where it has heads
            self.n_heads, self.n_kv_heads, self.head_dim = heads.n_heads, heads.n_kv_heads, heads.head_dim
        self.window = getattr(lead, "window", None) if keepers else None
        self.cache_slots = cache_slots_of(lead) if keepers else None
        self.state_slots = state_slots_of(self.mixers[recurrent[0]]) if recurrent else None
        self.uses_positions = bool(readers)
        for optional in ("positional_dim", "v_head_dim"):  # facts some mixers declare (latent attention)
            if hasattr(lead, optional):
                setattr(self, optional, getattr(lead, optional))
        # What the recurrence costs per token beyond its matmuls (summary), summed over the sub-mixers that say.
        if any(hasattr(m, "recurrent_flops_per_token") for m in self.mixers):
            self.recurrent_flops_per_token = sum(int(getattr(m, "recurrent_flops_per_token", 0)) for m in self.mixers)
        self._keeper = keepers[0] if keepers else None
        # The one that keeps keys runs first: its cache ``update`` claims this forward's columns for every layer.
        self._order = tuple(sorted(range(count), key=lambda i: i != self._keeper))

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        outputs: list[Tensor | None] = [None] * len(self.mixers)
        for i in self._order:
            scale_in, scale_out = self.in_multipliers[i], self.out_multipliers[i]
            y = self.mixers[i](x if scale_in == 1.0 else x * scale_in, ctx)
            outputs[i] = y if scale_out == 1.0 else y * scale_out
        total = outputs[0]
        for y in outputs[1:]:
            total = total + y
        assert total is not None
        return total

    @property
    def observe_weights(self) -> Callable[[Tensor], None] | None:
        """The attention probabilities of the sub-mixer that keeps keys (AttributeError when it reports none)."""
        if self._keeper is None or not hasattr(self.mixers[self._keeper], "observe_weights"):
            raise AttributeError("no sub-mixer of this parallel mixer reports attention probabilities")
        return self.mixers[self._keeper].observe_weights

    @observe_weights.setter
    def observe_weights(self, observe: Callable[[Tensor], None] | None) -> None:
        if self._keeper is None or not hasattr(self.mixers[self._keeper], "observe_weights"):
            raise AttributeError("no sub-mixer of this parallel mixer reports attention probabilities")
        self.mixers[self._keeper].observe_weights = observe

    def init_weights(self, *, std: float, residual_std: float) -> None:
        for mixer in self.mixers:
            init = getattr(mixer, "init_weights", None)
            if callable(init):
                init(std=std, residual_std=residual_std)

    def describe_kernel(self, *, bias: bool = False) -> str:
        """Each sub-mixer's kernel, joined with ``+`` (``specformer summary``)."""
        parts = []
        for mixer in self.mixers:
            describe = getattr(mixer, "describe_kernel", None)
            if not callable(describe):
                parts.append(type(mixer).__name__)
            elif "bias" in inspect.signature(describe).parameters:
                parts.append(describe(bias=bias))
            else:
                parts.append(describe())
        return " + ".join(parts)

    def extra_repr(self) -> str:
        return f"in_multipliers={list(self.in_multipliers)}, out_multipliers={list(self.out_multipliers)}"


__all__ = ["ParallelMixer"]
