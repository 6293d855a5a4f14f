"""The settings of BitLinear, the ternary-weight projection, importable without torch."""

from __future__ import annotations

from pydantic import Field

from specformer.registry.params import Params, Sized


class BitLinearParams(Params):
    """BitLinear (BitNet b1.58): ternary weights and 8-bit activations, trained through a float latent weight.

    Forward: each token's activations are scaled to the int8 range by ``127 / max|x|``, rounded and
    clamped to ``[-128, 127]``; the weight is divided by its mean absolute value (absmean), rounded
    and clamped to ``{-1, 0, 1}``; both are multiplied back by their scales, so the matmul sees the
    quantised values (Ma et al. 2024, "The Era of 1-bit LLMs"; Wang et al. 2023, "BitNet"). The
    float weight stays the parameter: the straight-through estimator passes each quantiser's
    gradient through unchanged, so an optimiser trains the latent weight. A projection fusing
    several (q, k and v; gate and up) keeps one absmean per part, as separate projections would.
    Same parameters as ``nn.Linear``, under the same names.
    """

    eps: float = Field(default=1e-5, gt=0, description="Floor of mean|W| and of each token's max|x| (an all-zero "
                                                        "weight or token is not divided by zero).")

    def sized(self, *, in_features: int, out_features: int, bias: bool = False,
              splits: tuple[int, ...] = ()) -> Sized:
        _check_splits(splits, out_features)
        return Sized(parameters=in_features * out_features + (out_features if bias else 0))


def _check_splits(splits: tuple[int, ...], out_features: int) -> None:
    if splits and (sum(splits) != out_features or min(splits) <= 0):
        raise ValueError(f"BitLinear splits {tuple(splits)} must be positive and add up to out_features "
                         f"({out_features}): each is the rows of one fused projection")
