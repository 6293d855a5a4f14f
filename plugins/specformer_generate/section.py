"""The ``generate`` section of a spec: how a model samples by default.

::

    generate:
      sampler: [{kind: repetition_penalty, penalty: 1.1}, {kind: top_k, k: 50}, {kind: temperature, value: 0.8}]
      max_new_tokens: 200
      seed: 0
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from specformer.params import Params, SubComponent
from specformer.registry import Resolved
from specformer_generate.samplers.pipeline import Sampler, build_sampler


class GenerateSpec(Params):
    """Defaults for ``specformer generate`` and :func:`specformer_generate.generate` on this model."""

    sampler: list[SubComponent("sampler")] | None = Field(  # type: ignore[valid-type]
        default=None,
        description=(
            "Sampler components applied in order to the next-token logits; ends with a draw from the "
            "result unless the last entry is greedy. Omitted: greedy decoding."
        ),
    )
    max_new_tokens: int = Field(default=128, gt=0, description="Most tokens generated after the prompt.")
    num_beams: int = Field(default=1, ge=1, description="Beam search with this many beams; 1 = sampling/greedy.")
    length_penalty: float = Field(
        default=1.0, description="Beam search: a finished beam scores sum(log p) / length ** length_penalty."
    )
    early_stopping: bool | Literal["never"] = Field(
        default=False,
        description=(
            "Beam search: true stops once num_beams beams finished; false stops when no running beam can "
            "plausibly beat them; 'never' only when none can."
        ),
    )
    seed: int | None = Field(default=None, description="Seed of the sampling draws; omitted: nondeterministic.")
    eos: int | list[int] | None = Field(
        default=None, description="Token id(s) that end a sequence; omitted: the tokenizer's end-of-text token."
    )

    @field_validator("early_stopping", mode="before")
    @classmethod
    def _early_stopping_choice(cls, value: Any) -> Any:
        # One message instead of one per member of the union.
        if value is True or value is False or value == "never":
            return value
        raise ValueError(f"early_stopping must be true, false or 'never', got {value!r}")

    @field_validator("eos", mode="before")
    @classmethod
    def _token_ids(cls, value: Any) -> Any:
        ids = value if isinstance(value, list) else [value]
        if value is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ValueError(f"eos must be a token id >= 0 or a list of them, got {value!r}")
        return value

    @field_validator("sampler")
    @classmethod
    def _chooser_last(cls, value: Any) -> Any:
        if value:
            Sampler([entry.make() if isinstance(entry, Resolved) else entry for entry in value])
        return value

    def build_sampler(self) -> Sampler:
        return build_sampler(self.sampler)

    def eos_ids(self) -> list[int] | None:
        if self.eos is None:
            return None
        return [self.eos] if isinstance(self.eos, int) else list(self.eos)
