"""The ``generate`` section of a spec: how a model samples by default.

::

    generate:
      sampler: [{kind: repetition_penalty, penalty: 1.1}, {kind: top_k, k: 50}, {kind: temperature, value: 0.8}]
      max_new_tokens: 200
      seed: 0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, field_validator

from specformer.registry.params import Params, SubComponent
from specformer_generate.samplers.params import check_chooser_last, check_constraint_first

if TYPE_CHECKING:
    from specformer_generate.samplers.pipeline import Sampler


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
        # By the params' CHOOSES_TOKEN, so that checking a spec builds no sampler (and imports no torch).
        check_chooser_last((entry.component.name, getattr(entry.params, "CHOOSES_TOKEN", False))
                           for entry in value or ())
        check_constraint_first((entry.component.name, getattr(entry.params, "CONSTRAINT", False))
                               for entry in value or ())
        return value

    def build_sampler(self) -> Sampler:
        from specformer_generate.samplers.pipeline import build_sampler  # late: imports torch; the section is read without it

        return build_sampler(self.sampler)

    def eos_ids(self) -> list[int] | None:
        if self.eos is None:
            return None
        return [self.eos] if isinstance(self.eos, int) else list(self.eos)
