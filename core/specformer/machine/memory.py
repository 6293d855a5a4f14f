"""Refusing to allocate a model the machine cannot hold, before allocating it.

A spec or checkpoint header of a few bytes can describe a model of hundreds of
gigabytes. :func:`specformer.build` and :func:`specformer.load` compute what they
will allocate (:mod:`specformer.model.sizes`) and call :func:`check_memory` first, which
compares it with the memory available on the target device:

- CPU: the least of ``MemAvailable`` from ``/proc/meminfo`` (or ``os.sysconf`` elsewhere), what
  the process's address-space limit (``ulimit -v``, ``RLIMIT_AS``) leaves, and what its
  control group's memory limit (cgroup v2 ``memory.max``, v1 ``memory.limit_in_bytes``: a
  container's) leaves; each of them makes an allocation fail, whichever comes first;
- CUDA: the free memory ``torch.cuda.mem_get_info`` reports;
- ``meta``: nothing is allocated, nothing is checked.

The environment variable ``SPECFORMER_MAX_MEMORY`` replaces that limit: a byte count
with an optional unit (``64G`` or ``64GiB``: binary; ``500MB``: decimal; ``1e10``), or ``unlimited``
to switch the check off. The CLI's ``--max-memory`` sets it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from specformer.errors import InputError, MemoryLimitError
from specformer.messages import format_bytes

ENV_VAR = "SPECFORMER_MAX_MEMORY"
_OFF = {"unlimited", "none", "off", "inf"}
_UNITS = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgtp", start=1):
    # K, KiB: powers of 1024; KB: powers of 1000 (as disks are sold). The generate plugin reads the same.
    _UNITS.update({_letter: 1024**_i, f"{_letter}ib": 1024**_i, f"{_letter}b": 1000**_i})


def parse_bytes(text: str) -> int | None:
    """``"64G"`` -> 68719476736; ``"500MB"`` -> 500000000; ``"unlimited"`` -> None."""
    value = text.strip().lower()
    if value in _OFF:
        return None
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)", value)
    size = float(match.group(1)) * _UNITS[match.group(2)] if match and match.group(2) in _UNITS else 0.0
    if not (size >= 1 and size < 2**63):
        raise InputError(
            f"{ENV_VAR}={text[:40]!r} is not a size; write bytes with an optional unit (64G, 512MiB, 500MB) or 'unlimited'"
        )
    return int(size)


#: Where the process's own figures are read (tests point these at a made-up tree).
PROC_SELF = Path("/proc/self")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_NO_LIMIT = 1 << 60  # cgroup v1 writes "no limit" as a number near 2**63


def available_memory(device: torch.device | str | None = None) -> int | None:
    """Bytes free for new tensors on ``device`` (default: the default device); None if unknown or meta."""
    found = _available(device)
    return found[0] if found else None


def _available(device: torch.device | str | None) -> tuple[int, str] | None:
    """The free bytes and which limit gives them (for messages); None if unknown or meta."""
    device = torch.device(device) if device is not None else torch.get_default_device()
    if device.type == "meta":
        return None
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free), "free on cuda"
    if device.type != "cpu":
        return None  # mps, xpu...: no portable query; the allocator will say
    limits = [(size, why) for size, why in ((_memory_available(), "available on cpu"),
                                            (_address_space_left(), "left of this process's address-space limit, ulimit -v"),
                                            (_cgroup_left(), "left of this control group's memory limit"))
              if size is not None]
    return min(limits) if limits else None


def _memory_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _address_space_left() -> int | None:
    """``RLIMIT_AS`` less the address space already mapped (``VmSize``); None without such a limit."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    mapped = _status_kib("VmSize")
    return max(soft - (mapped or 0) * 1024, 0)


def _status_kib(field: str) -> int | None:
    try:
        for line in (PROC_SELF / "status").read_text(encoding="ascii").splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_left() -> int | None:
    """The control group's memory limit less its usage (v2, else v1); None without one or off Linux."""
    try:
        lines = (PROC_SELF / "cgroup").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    for line in lines:
        _id, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        relative = path.lstrip("/")
        if controllers == "":  # v2: one unified hierarchy, "0::/path"
            left = _left(CGROUP_ROOT / relative / "memory.max", CGROUP_ROOT / relative / "memory.current")
        elif "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            where = CGROUP_ROOT / "memory" / relative
            left = _left(where / "memory.limit_in_bytes", where / "memory.usage_in_bytes")
            if left is None:  # inside a container the group's folder is often mounted as the root
                left = _left(CGROUP_ROOT / "memory" / "memory.limit_in_bytes",
                             CGROUP_ROOT / "memory" / "memory.usage_in_bytes")
        else:
            continue
        if left is not None:
            return left
    return None


def _left(limit_file: Path, usage_file: Path) -> int | None:
    try:
        limit = limit_file.read_text(encoding="ascii").strip()
        if limit == "max" or int(limit) >= _NO_LIMIT:
            return None
        return max(int(limit) - int(usage_file.read_text(encoding="ascii").strip()), 0)
    except (OSError, ValueError):
        return None


def memory_limit(device: torch.device | str | None = None) -> tuple[int | None, str]:
    """The byte limit for allocations on ``device`` and where it comes from (for messages)."""
    override = os.environ.get(ENV_VAR, "").strip()
    if override:
        return parse_bytes(override), f"{ENV_VAR}={override}"
    found = _available(device)
    return (found[0], found[1]) if found else (None, "unknown")


def check_memory(needed: int, *, what: str, device: torch.device | str | None = None) -> None:
    """Raise :class:`MemoryLimitError` if ``needed`` bytes exceed the limit for ``device``."""
    limit, source = memory_limit(device)
    if limit is None or needed <= limit:
        return
    raise MemoryLimitError(
        f"{what} needs {human_bytes(needed)} ({needed:,} bytes) but the limit is {human_bytes(limit)} ({source}); "
        f"to go ahead anyway set {ENV_VAR} (e.g. {ENV_VAR}={_suggest(needed)}, or 'unlimited'), "
        f"or pass --max-memory to the specformer command"
    )


def human_bytes(n: float) -> str:
    """The project's one size style (``1.5 GiB``), from :mod:`specformer.messages`."""
    return format_bytes(n)


def _suggest(needed: int) -> str:
    return f"{-(-needed // 1024**3) + 1}G"


__all__ = ["ENV_VAR", "available_memory", "check_memory", "human_bytes", "memory_limit", "parse_bytes"]
