"""The grouping params shared by the built-in routers, with the check that needs only them."""

from __future__ import annotations

from pydantic import Field, model_validator

from specformer.registry.params import Params


class GroupedParams(Params):
    """Router params with DeepSeek's grouped (device/node-limited) selection."""

    n_group: int = Field(
        default=1, gt=0,
        description="Split the experts into this many contiguous groups (DeepSeek's devices/nodes); 1: no grouping.",
    )
    topk_group: int = Field(
        default=1, gt=0, description="Groups each token may choose experts from (with n_group > 1); at most n_group.",
    )

    @model_validator(mode="after")
    def _groups_fit(self) -> "GroupedParams":
        if self.topk_group > self.n_group:
            raise ValueError(f"topk_group ({self.topk_group}) cannot exceed n_group ({self.n_group})")
        return self
