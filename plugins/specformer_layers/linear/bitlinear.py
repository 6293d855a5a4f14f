"""BitLinear: absmean ternary weights and per-token absmax int8 activations, with straight-through gradients."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specformer_layers.linear.bitlinear_params import BitLinearParams, _check_splits

class _StraightThrough(torch.autograd.Function):
    """Forward: the quantised value exactly; backward: the gradient to the float value unchanged (the STE)."""

    @staticmethod
    def forward(ctx, value: Tensor, quantised: Tensor) -> Tensor:  # type: ignore[override]
        return quantised

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad, None


def _wide(t: Tensor) -> Tensor:
    """float32 for half and bfloat16 (the scales and rounding are computed there); float64 stays float64."""
    return t if t.dtype == torch.float64 else t.float()


#: The int8 range the activations are rounded into.
ACT_MAX, ACT_MIN = 127, -128


def quantize_activations(x: Tensor, *, eps: float) -> Tensor:
    """Each token (last dim) rounded on the int8 grid of step max|x| / 127, in x's dtype; gradient passed straight."""
    xf = _wide(x)
    scale = ACT_MAX / xf.abs().amax(dim=-1, keepdim=True).clamp(min=eps)  # (..., 1)
    q = ((xf * scale).round().clamp(ACT_MIN, ACT_MAX) / scale).to(x.dtype)
    return _StraightThrough.apply(x, q)


def ternary_codes(weight: Tensor, splits: tuple[int, ...], *, eps: float) -> tuple[Tensor, Tensor]:
    """The weight's codes in {-1, 0, 1} (float) and one absmean per part of ``splits`` (rows): (out, in), (parts,)."""
    wf = _wide(weight.detach())
    parts = wf.split(splits, dim=0)
    means = torch.stack([p.abs().mean() for p in parts]).clamp(min=eps)  # (parts,)
    codes = torch.cat([(p * (1.0 / m)).round().clamp(-1, 1) for p, m in zip(parts, means)], dim=0)
    return codes, means


def quantize_weight(weight: Tensor, splits: tuple[int, ...], *, eps: float) -> Tensor:
    """The weight as its ternary codes times each part's absmean, in its dtype; gradient passed straight."""
    codes, means = ternary_codes(weight, splits, eps=eps)
    rows = torch.repeat_interleave(means, torch.tensor(splits, device=means.device))[:, None]  # (out, 1)
    q = (codes / (1.0 / rows)).to(weight.dtype)
    return _StraightThrough.apply(weight, q)


class BitLinear(nn.Linear):
    """An ``nn.Linear`` (same ``weight``/``bias``) whose forward multiplies quantised values: :class:`BitLinearParams`."""

    Params = BitLinearParams

    def __init__(self, params: BitLinearParams | None = None, *, in_features: int, out_features: int,
                 bias: bool = False, splits: tuple[int, ...] = ()) -> None:
        params = params if params is not None else BitLinearParams()
        _check_splits(tuple(splits), out_features)
        super().__init__(in_features, out_features, bias=bias)
        self.splits = tuple(splits) or (out_features,)
        self.eps = params.eps

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(quantize_activations(x, eps=self.eps),
                        quantize_weight(self.weight, self.splits, eps=self.eps), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, splits={self.splits}, eps={self.eps}"
