"""The settings of the per-layer input parts, importable without torch (listing components reads only these)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from specformer.registry.params import Params, Sized, SubComponent
from specformer.model.sized import linear, total


class PerLayerEmbeddingParams(Params):
    """Every block gets a small input of its own, from the token and from the token's embedding (Gemma 3n, Gemma 4).

    For ``L`` layers of ``width`` channels each, per token: a lookup in a table of ``L x width``
    columns, scaled by ``sqrt(width)``, and a projection of the (scaled) token embedding ``e``,
    ``norm(reshape(e W / sqrt(d_model)))`` per layer; the two are added and scaled by
    ``1/sqrt(2)``: ``p[l] = (norm(e W / sqrt(d))[l] + sqrt(width) E[token][l]) / sqrt(2)``.
    Block ``l`` receives ``p[l]`` (``(B, T, width)``); its layout gates it into the
    residual stream (``sandwich``: ``x + norm(proj(act(x G) * p[l]))``). The table is
    large (``vocab x L x width``: Gemma 4 E2B's holds 2.3 of its 5.1 billion parameters)
    but is only read, one row per token, so it can live off the accelerator.
    """

    #: What a spec using this part also needs (the docs' example snippets merge it in): a layout that takes the slice.
    snippet_context: ClassVar[dict[str, Any]] = {"model": {"block": {"layout": "sandwich"}}}

    width: int = Field(gt=0, description="Channels of each layer's input (Gemma's hidden_size_per_layer_input).",
                       examples=[8])
    vocab_size: int | None = Field(
        default=None, gt=0, description="Rows of the per-layer table; default the model's vocab_size.",
    )
    norm: SubComponent("norm") = Field(  # type: ignore[valid-type]
        default="rmsnorm", validate_default=True, description="The norm of each layer's slice of the projection.",
    )

    def sized(self, *, vocab_size: int, d_model: int, n_layers: int) -> Sized:
        columns = n_layers * self.width  # every layer's slice side by side
        parameters = total((self.vocab_size or vocab_size) * columns, linear(d_model, columns),
                           self.norm.sized(dim=self.width).parameters)
        return Sized(parameters=parameters, width=self.width)
