"""The settings of the parallel mixer, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from specformer.registry.params import Params, Sized, SubComponent
from specformer.model.sized import total


class ParallelMixerParams(Params):
    """Several token mixers side by side on the same input, their outputs summed: ``sum_i out_i * m_i(x * in_i)``.

    Falcon-H1 (Zuo et al. 2025, arXiv:2507.22448) runs softmax attention and a Mamba-2 mixer
    in parallel in every block, each with a multiplier on its input and on its output
    (``attention_in_multiplier``, ``attention_out_multiplier``, ``ssm_in_multiplier``,
    ``ssm_out_multiplier``); Hymba's hybrid heads are the same shape. Every sub-mixer is a
    component of the ``attention`` kind (``{kind: attention, ...}``, ``{kind: mamba2, ...}``)
    built for the same layer. The layer keeps what its sub-mixers keep: at most one of them
    may keep keys per token (its heads and window are the layer's) and at most one may keep
    a recurrent state. A cached forward runs the one that keeps keys first, so the cache
    learns this forward's columns from it; outputs are summed in the listed order. One
    sub-mixer alone is allowed: it only scales its input and output.
    """

    mixers: list[SubComponent("mixer")] = Field(  # type: ignore[valid-type]
        min_length=1, description="The token mixers run on the same input (components of the attention kind).",
    )
    in_multipliers: list[float] | None = Field(
        default=None, description="Each mixer's input is multiplied by its entry (one per mixer); default 1 for each, written out.",
    )
    out_multipliers: list[float] | None = Field(
        default=None, description="Each mixer's output is multiplied by its entry before the sum; default 1 for each, written out.",
    )

    @model_validator(mode="before")
    @classmethod
    def _ones_written_out(cls, data: Any) -> Any:
        # One spelling for "no scaling": a spec that leaves them out and one that writes 1s compare equal.
        if isinstance(data, dict) and isinstance(data.get("mixers"), list):
            missing = {name: [1.0] * len(data["mixers"]) for name in ("in_multipliers", "out_multipliers")
                       if data.get(name) is None}
            if missing:
                data = {**data, **missing}
        return data

    @model_validator(mode="after")
    def _one_multiplier_per_mixer(self) -> "ParallelMixerParams":
        for name in ("in_multipliers", "out_multipliers"):
            values = getattr(self, name)
            if values is not None and len(values) != len(self.mixers):
                raise ValueError(f"{name} has {len(values)} entries for {len(self.mixers)} mixers: give one per mixer")
        return self


    def sized(self, *, d_model: int, layer_index: int = 0, n_layers: int = 1, context_length: int | None = None) -> Sized:
        sizes = {"d_model": d_model, "layer_index": layer_index, "n_layers": n_layers}
        if context_length is not None:  # a sub-mixer that sizes a state by the context needs it
            sizes["context_length"] = context_length
        mixers = [ref.sized(**sizes) for ref in self.mixers]
        names = [f"{ref.component.name} (mixers[{i}])" for i, ref in enumerate(self.mixers)]
        keepers = [i for i, m in enumerate(mixers) if m.caches_tokens]
        recurrent = [i for i, m in enumerate(mixers) if m.keeps_state]
        if len(keepers) > 1:
            raise ValueError(f"parallel: at most one sub-mixer may keep keys per token (one cache entry per layer), "
                             f"got {', '.join(names[i] for i in keepers)}")
        if len(recurrent) > 1:
            raise ValueError(f"parallel: at most one sub-mixer may keep a recurrent state (one state per layer), "
                             f"got {', '.join(names[i] for i in recurrent)}")
        readers = [i for i, m in enumerate(mixers) if m.uses_positions]
        lead = mixers[self.lead(keepers, readers)]
        return Sized(parameters=total(*(m.parameters for m in mixers)), n_heads=lead.n_heads,
                     n_kv_heads=lead.n_kv_heads, head_dim=lead.head_dim, positional_dim=lead.positional_dim,
                     uses_positions=bool(readers), caches_tokens=bool(keepers), keeps_state=bool(recurrent),
                     slots=lead.cache_slots if keepers else None, window=lead.window if keepers else None)

    @staticmethod
    def lead(keepers: list[int], readers: list[int]) -> int:
        """The sub-mixer whose heads the layer shows: the one that caches, else the first that reads positions."""
        return (keepers or readers or [0])[0]


__all__ = ["ParallelMixerParams"]
