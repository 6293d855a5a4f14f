"""The kernels made for recurrent mixers, used on CUDA when installed; PyTorch's chunked forms everywhere else.

flash-linear-attention (``fla``) has fused chunked kernels for the gated delta rule and for
Kimi Delta Attention, and ``mamba-ssm`` for Mamba-2's scan. They are optional
(``pip install 'specformer[kernels]'``, on a CUDA machine) and written by their authors:
specformer writes no Triton or CUDA of its own. The pure PyTorch forms
(:mod:`.delta_rule`, :mod:`.ssd`) are the reference and what runs on the CPU, and what
runs whenever the package is missing, the tensors are not on CUDA, or a forward needs the
state after every token (speculative decoding's verification pass).

Each adapter takes and returns exactly what the PyTorch form does, so a mixer asks for
"the chunked form" and gets the fastest one there is; only the layout changes on the way
(the kernels read ``(B, T, H, ...)``, the torch forms ``(B, H, T, ...)`` for the delta rule).
``specformer summary`` prints :meth:`OptionalKernel.describe` for each layer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable

from torch import Tensor

from specformer_layers.mixers.delta_rule import DeltaRuleOutput, delta_rule_chunked
from specformer_layers.mixers.ssd import ssd_chunked

#: The extra that installs every optional kernel (pyproject's ``kernels``).
EXTRA = "specformer[kernels]"


@dataclass
class OptionalKernel:
    """A function of an optional package, imported once on first use."""

    package: str  # what pip installs
    module: str
    function: str
    #: Devices it runs on; tests widen it to run a stand-in kernel on the CPU.
    devices: tuple[str, ...] = ("cuda",)
    _loaded: Any = field(default=None, repr=False)
    _tried: bool = field(default=False, repr=False)

    def load(self) -> Callable[..., Any] | None:
        """The function, or None when its package is not installed (or fails to import: a CUDA mismatch)."""
        if not self._tried:
            self._tried = True
            try:
                self._loaded = getattr(importlib.import_module(self.module), self.function)
            except Exception:  # noqa: BLE001 - a kernel that cannot load leaves the torch form in charge
                self._loaded = None
        return self._loaded

    def runs_on(self, tensor: Tensor) -> Callable[..., Any] | None:
        """The function when ``tensor``'s device is one it runs on and it is installed, else None."""
        return self.load() if tensor.device.type in self.devices else None

    def describe(self, torch_form: str) -> str:
        """What a layer runs, in words: this kernel on its devices when installed, ``torch_form`` otherwise."""
        where = "/".join(d.upper() if d == "cuda" else d for d in self.devices)
        status = "installed" if self.load() is not None else f"not installed: pip install '{EXTRA}'"
        return f"{self.package} {self.function} on {where} ({status}); {torch_form} otherwise"

    def reset(self) -> None:
        """Forget the import attempt (tests install stand-ins)."""
        self._loaded, self._tried = None, False


GATED_DELTA_RULE = OptionalKernel("flash-linear-attention", "fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
KIMI_DELTA_RULE = OptionalKernel("flash-linear-attention", "fla.ops.kda", "chunk_kda")
SSD = OptionalKernel("mamba-ssm", "mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined")


def delta_rule_kernel(log_decay: Tensor) -> OptionalKernel:
    """The kernel for a delta rule with this decay: per key channel (KDA) or one per head (Gated DeltaNet)."""
    return KIMI_DELTA_RULE if log_decay.dim() == 4 else GATED_DELTA_RULE


def chunked_delta_rule(q: Tensor, k: Tensor, v: Tensor, beta: Tensor, log_decay: Tensor, *,
                       state: Tensor | None = None, scale: float | None = None, chunk: int = 64) -> DeltaRuleOutput:
    """:func:`~.delta_rule.delta_rule_chunked`, by flash-linear-attention's kernel where it runs.

    Same arguments (``q``, ``k`` ``(B, H, T, dk)``, ``v`` ``(B, H, T, dv)``, ``beta`` ``(B, H, T)``,
    ``log_decay`` ``(B, H, T)`` or ``(B, H, T, dk)``, ``state`` ``(B, H, dk, dv)``) and results.
    """
    fused = delta_rule_kernel(log_decay).runs_on(q)
    if fused is None:
        return delta_rule_chunked(q, k, v, beta, log_decay, state=state, scale=scale, chunk=chunk)
    # fla reads (B, T, H, ...); its state is (B, H, dk, dv) as ours, kept in float32.
    out, final = fused(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), g=log_decay.transpose(1, 2).float(),
                       beta=beta.transpose(1, 2), scale=scale if scale is not None else q.shape[-1] ** -0.5,
                       initial_state=None if state is None else state.float(), output_final_state=True)
    return DeltaRuleOutput(out=out.transpose(1, 2).to(v.dtype), state=final.to(v.dtype))


def chunked_ssd(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *, chunk: int, D: Tensor | None = None,
                state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """:func:`~.ssd.ssd_chunked`, by mamba-ssm's kernel where it runs; same arguments and results.

    ``dt`` arrives already through its softplus and clamp, so the kernel is asked for neither.
    """
    fused = SSD.runs_on(x)
    if fused is None:
        return ssd_chunked(x, dt, A, B, C, chunk=chunk, D=D, state=state)
    y, final = fused(x, dt, A, B, C, chunk_size=chunk, D=D, initial_states=state, dt_softplus=False,
                     return_final_states=True)
    return y.float(), final.float()


__all__ = ["EXTRA", "GATED_DELTA_RULE", "KIMI_DELTA_RULE", "SSD", "OptionalKernel", "chunked_delta_rule", "chunked_ssd",
           "delta_rule_kernel"]
