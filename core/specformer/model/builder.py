"""Building: the top of the core's path for a spec, and the public :func:`build`.

The path, each step once::

    file / dict / Spec
      -> check_spec (specformer.spec.check): read, validate and resolve (specformer.spec.validate),
         every size constraint (specformer.spec.size_check), plugins' checks  -> CheckedSpec
      -> memory check against the shapes on the meta device (CheckedSpec.shape; specformer.machine.memory)
      -> assemble (specformer.model.assemble): the resolved components become modules, once
      -> init_weights, or, for a checkpoint, the stored tensors (``init=False``)
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

import torch

from specformer.model.assemble import assemble
from specformer.model.decoder import Decoder
from specformer.errors import InputError, excerpt
from specformer.machine.memory import check_memory
from specformer.spec.check import CheckedSpec, check_spec
from specformer.spec.shapes import Spec


def build(
    spec: "Spec | str | Path | dict[str, Any]",
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    seed: int | None = None,
    registry: Any = None,
    init: bool = True,
) -> Decoder:
    """Validate ``spec`` (a :class:`Spec`, a file path or a dict) and build its :class:`Decoder`.

    Weights are initialised (seeded by ``seed`` when given); ``model.spec`` holds the spec.
    With ``init=False`` the model is allocated on the meta device and materialised once,
    uninitialised, for weights that are about to be overwritten (a checkpoint, an import):
    only its derived tables (RoPE, ALiBi) hold values; every parameter and persistent
    buffer must then be loaded (``model.load_state_dict(..., strict=True)``).
    A model larger than the memory available on ``device`` is refused before anything
    is allocated (:class:`~specformer.errors.MemoryLimitError`; see :mod:`specformer.machine.memory`).
    """
    return build_checked(check_spec(spec, registry=registry), device=device, dtype=dtype, seed=seed, init=init)


def build_checked(
    checked: CheckedSpec,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    seed: int | None = None,
    init: bool = True,
) -> Decoder:
    """:func:`build` for a spec that already went through :func:`~specformer.spec.check.check_spec`."""
    assert checked.shape is not None, "build needs the size check"
    if str(device) != "meta":
        # Built in float32 first, then cast: the float32 size is the peak.
        check_memory(checked.shape.total_bytes(), what="building this model", device=device)
    if init or str(device) == "meta":
        with _seeded(seed):
            model = assemble(checked.resolved, device=device)
            if str(device) != "meta":
                model.init_weights(std=checked.spec.model.init_std)
    else:
        # Shapes first (nothing allocated, nothing initialised), then memory once. to_empty
        # leaves parameters and persistent buffers uninitialised, for the caller to fill;
        # derived tables (non-persistent buffers: RoPE frequencies, ALiBi slopes) are
        # recomputed by their modules, which keep a CPU master copy for exactly this.
        model = assemble(checked.resolved, device="meta")
        model.to_empty(device=device if device is not None else torch.get_default_device())
    model.spec = checked.spec
    if dtype is not None:
        model = model.to(dtype=dtype)
    return model


@contextlib.contextmanager
def _seeded_ctx(seed: int) -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


#: The seeds torch.manual_seed takes; a larger one is torch's ValueError from deep inside (found by fuzzing).
SEED_RANGE = (-(2**63), 2**64 - 1)


def _seeded(seed: int | None) -> contextlib.AbstractContextManager[None]:
    if seed is None:
        return contextlib.nullcontext()
    if isinstance(seed, bool) or not isinstance(seed, int) or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise InputError(f"seed must be an integer from -2**63 to 2**64 - 1, got {excerpt(seed)}")
    return _seeded_ctx(seed)


__all__ = ["build", "build_checked"]
