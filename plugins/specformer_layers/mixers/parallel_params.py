"""The settings of the parallel mixer, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from specformer.registry.params import Params, SubComponent


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

    mixers: list[SubComponent("attention")] = Field(  # type: ignore[valid-type]
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


__all__ = ["ParallelMixerParams"]
