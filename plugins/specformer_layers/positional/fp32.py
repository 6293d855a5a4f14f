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


#: Tables with more elements than this are only sized, never computed, while a model is laid
#: out on the meta device: validating ``d_model: 1e9`` must not compute gigabytes of
#: frequencies on the CPU (no real head is within orders of magnitude of it).
SIZED_ONLY_ELEMENTS = 1 << 22


def sized_only() -> bool:
    """True while modules are laid out on the meta device (a size check or ``build(init=False)``)."""
    return torch.get_default_device().type == "meta"


def table_device(elements: int) -> str:
    """Where to compute a table of ``elements`` values: the CPU, or meta (shape only) past the bound."""
    return "meta" if sized_only() and elements > SIZED_ONLY_ELEMENTS else "cpu"


class Float32Tables(nn.Module):
    """Base for modules holding derived constant tables (non-persistent, never in checkpoints)."""

    def __init__(self) -> None:
        super().__init__()
        self._fp32_masters: dict[str, Tensor] = {}
        self._sized_only: set[str] = set()

    def register_table(self, name: str, value: Tensor) -> None:
        """Register ``value`` (computed on the CPU) as a float32 buffer on the current default device.

        A meta ``value`` (a table too large to compute while sizing, see
        :data:`SIZED_ONLY_ELEMENTS`) is registered without a master copy: such a module can
        be sized but never materialised.
        """
        if value.is_meta:
            if not sized_only():
                raise ValueError(f"table {name!r} must be computed on a real device (the CPU), not meta")
            self._sized_only.add(name)
            self.register_buffer(name, value.to(torch.float32), persistent=False)
            return
        master = value.detach().to(device="cpu", dtype=torch.float32)
        self._fp32_masters[name] = master
        self.register_buffer(name, master.to(torch.get_default_device()), persistent=False)

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Any:
        super()._apply(fn, recurse)
        for name in self._sized_only:
            if not getattr(self, name).is_meta:
                raise ValueError(f"table {name!r} was only sized on the meta device, never computed: "
                                 "a model this large cannot be materialised")
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
    Past :data:`SIZED_ONLY_ELEMENTS` pairs under a meta device only the shape is made.
    """
    device = table_device((rotary_dim + 1) // 2)
    return torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float() / rotary_dim
