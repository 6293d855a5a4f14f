"""Tables of frequencies and slopes that must stay float32 whatever dtype the model is cast to.

``model.to(torch.bfloat16)`` casts every floating buffer. A rotary frequency rounded to
bfloat16 keeps three significant digits, so the angle ``position * inv_freq`` of a token
a few thousand positions in is off by whole turns. The modules here keep a float32
master copy of such tables on the CPU and restore it after every ``to()``/``cuda()``
(both go through ``nn.Module._apply``); only the device follows the model.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import Tensor, nn


class Float32Tables(nn.Module):
    """Base for modules holding derived constant tables (non-persistent, never in checkpoints)."""

    def __init__(self) -> None:
        super().__init__()
        self._fp32_masters: dict[str, Tensor] = {}

    def register_table(self, name: str, value: Tensor) -> None:
        """Register ``value`` (computed on the CPU) as a float32 buffer on the current default device."""
        if value.is_meta:
            raise ValueError(f"table {name!r} must be computed on a real device (the CPU), not meta")
        master = value.detach().to(device="cpu", dtype=torch.float32)
        self._fp32_masters[name] = master
        self.register_buffer(name, master.to(torch.get_default_device()), persistent=False)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        super()._apply(fn, recurse)
        for name, master in self._fp32_masters.items():
            current = getattr(self, name)
            if not current.is_meta:
                # Restore the exact float32 values (a cast may have rounded them, a to_empty
                # left them uninitialised); keep whatever device the cast chose.
                self._buffers[name] = master.to(current.device)
        return self


def rope_exponents(rotary_dim: int) -> Tensor:
    """``2i / rotary_dim`` for each channel pair, in float32 on the CPU (even under a meta device).

    Computed exactly as the Llama reference code and transformers do (int64 arange, then
    float32), so that frequencies match the ones a checkpoint was trained with bit for bit.
    """
    return torch.arange(0, rotary_dim, 2, dtype=torch.int64, device="cpu").float() / rotary_dim
