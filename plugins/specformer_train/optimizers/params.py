"""The settings of the built-in optimizers and their param-group rules, in a module that imports no torch.

``specformer components``, ``specformer schema`` and ``specformer validate`` read these models
without building an optimizer. Each model's docstring is the optimizer's description in the
catalogue (its first line the summary).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator, model_validator

from specformer.registry.params import Params
from specformer.renamed import current_patterns
from specformer.spec.strict import StrictFloat, StrictInt


class GroupRule(BaseModel):
    """Settings for the parameters a rule matches (by role or by name)."""

    model_config = ConfigDict(extra="forbid")

    match: list[str] = Field(
        min_length=1,
        description="Roles (matrix, embedding, head, vector) or name globs (e.g. 'blocks.*.mixer.*') "
                    "this rule applies to; the first matching rule wins.",
    )
    lr: StrictFloat | None = Field(default=None, gt=0, le=10, description="Peak learning rate of these parameters.")
    lr_scale: StrictFloat | None = Field(
        default=None, gt=0, description="Multiply the role's default peak learning rate by this (instead of lr)."
    )
    min_lr: StrictFloat | None = Field(
        default=None, ge=0,
        description="Their learning rate at the end of the decay; default train.min_lr scaled like the peak.",
    )
    weight_decay: StrictFloat | None = Field(default=None, ge=0, description="Their weight decay.")

    @field_validator("match")
    @classmethod
    def _current_names(cls, match: list[str]) -> list[str]:
        # Globs written before the block's `attention` became `mixer` (blocks.*.attention.*) still match.
        return current_patterns(match, where="optimizer param-group match")

    @model_validator(mode="after")
    def _one_lr(self) -> "GroupRule":
        if self.lr is not None and self.lr_scale is not None:
            raise ValueError("give lr or lr_scale, not both")
        return self


class AdamWParams(Params):
    """AdamW with decoupled weight decay on matrices only (fused on CUDA, foreach elsewhere).

    Settings of ``adamw``; learning rate, betas, eps and weight decay come from ``train:``.
    """

    groups: list[GroupRule] = Field(
        default_factory=list, description="Rules that change the lr / weight decay of some parameters."
    )
    fused: StrictBool | Literal["auto"] = Field(
        default="auto", description="auto: torch's fused kernel on CUDA, the foreach path elsewhere."
    )
    betas: tuple[StrictFloat, StrictFloat] | None = Field(default=None, description="(beta1, beta2); default train.betas.")
    eps: StrictFloat | None = Field(default=None, gt=0, description="Epsilon; default train.eps.")


class MuonParams(Params):
    """Muon (Newton-Schulz orthogonalised Nesterov momentum) for hidden matrices, AdamW for the rest.

    Settings of ``muon``: Muon for hidden matrices; the other parameters use AdamW with train's settings.
    """

    lr: StrictFloat = Field(default=0.02, gt=0, le=10, description="Peak learning rate of the hidden matrices (Muon's).")
    momentum: StrictFloat = Field(default=0.95, ge=0, lt=1, description="Muon's momentum.")
    nesterov: StrictBool = Field(default=True, description="Nesterov momentum.")
    ns_steps: StrictInt = Field(default=5, gt=0, le=20, description="Newton-Schulz iterations.")
    weight_decay: StrictFloat = Field(default=0.0, ge=0, description="Decoupled weight decay of the hidden matrices.")
    ns_dtype: Literal["auto", "bf16", "fp32"] = Field(
        default="auto", description="Precision of the Newton-Schulz iteration: auto is bf16 on CUDA, fp32 elsewhere."
    )
    betas: tuple[StrictFloat, StrictFloat] | None = Field(default=None, description="The AdamW part's betas; default train.betas.")
    eps: StrictFloat | None = Field(default=None, gt=0, description="The AdamW part's epsilon; default train.eps.")
    groups: list[GroupRule] = Field(
        default_factory=list, description="Rules that change the lr / weight decay of some parameters."
    )


class LionParams(Params):
    """Lion: sign of the interpolated momentum, decoupled weight decay on matrices only.

    Settings of ``lion``; learning rate and weight decay come from ``train:`` (and ``groups``).
    """

    betas: tuple[StrictFloat, StrictFloat] = Field(default=(0.9, 0.99), description="(beta1: the update's mix, beta2: the momentum's).")
    groups: list[GroupRule] = Field(
        default_factory=list, description="Rules that change the lr / weight decay of some parameters."
    )


class SGDParams(Params):
    """SGD with momentum (torch.optim.SGD, foreach); L2 weight decay on matrices only.

    Settings of ``sgd``; learning rate and weight decay (L2, matrices only) come from ``train:``.
    """

    momentum: StrictFloat = Field(default=0.9, ge=0, lt=1, description="Momentum (0: plain SGD).")
    nesterov: StrictBool = Field(default=False, description="Nesterov momentum (needs momentum > 0).")
    groups: list[GroupRule] = Field(
        default_factory=list, description="Rules that change the lr / weight decay of some parameters."
    )
