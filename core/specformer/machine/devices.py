"""Turning a device name a user typed (``--device cuda:1``) into a ``torch.device``, or one clear error.

Every command that runs a model on a chosen device (generate, eval, serve, ...) parses
the name here, so the accepted names and the messages are the same everywhere.
"""

from __future__ import annotations

import torch

from specformer.errors import UserError

ACCEPTED = "cpu, cuda, cuda:N or mps"


def parse_device(name: str, *, option: str = "--device") -> torch.device:
    """The device named ``name``; :class:`UserError` naming ``option`` when it is unknown or absent here."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise UserError(f"{option} {name!r} is not a device name ({exc}); use {ACCEPTED}") from None
    if device.type == "cpu":
        return device
    if device.type == "meta":  # shapes only: no weights to load nor tokens to compute (found by fuzzing)
        raise UserError(f"{option} {name}: the meta device holds no data, so nothing can be computed on it; use {ACCEPTED}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{option} {name}: CUDA is not available on this machine; use {option} cpu")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"{option} {name}: MPS is not available on this machine; use {option} cpu")
    if device.type not in ("cuda", "mps") and not _backend_available(device.type):
        # torch.device() parses every name PyTorch knows of (xla, hpu, ipu, ...), built in or not (found by fuzzing)
        raise UserError(f"{option} {name}: this PyTorch has no working {device.type} backend; use {ACCEPTED}")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"{option} {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                        f"numbered from 0; use {option} cuda:0")
    return device


def _backend_available(kind: str) -> bool:
    """Whether ``torch.<kind>`` exists here and says a device of that kind is present (xpu, for example)."""
    backend = getattr(torch, kind, None)
    is_available = getattr(backend, "is_available", None)
    try:
        return bool(callable(is_available) and is_available())
    except Exception:  # a backend module that cannot even answer is as good as absent
        return False


__all__ = ["ACCEPTED", "parse_device"]
