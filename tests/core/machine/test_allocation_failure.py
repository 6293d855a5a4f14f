"""An allocation that fails past the memory checks ends a command in one line, exit 2 (specformer.machine.allocation)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from specformer.cli import main as cli
from specformer.machine.allocation import is_allocation_failure, requested_bytes


def test_pytorchs_own_allocator_failure_is_recognised_with_its_size() -> None:
    """A real failed allocation, in a process whose address space ulimit -v (RLIMIT_AS) caps at 2 GiB."""
    script = textwrap.dedent("""
        import resource, torch
        from specformer.machine.allocation import is_allocation_failure, requested_bytes
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        try:
            torch.empty(10**10, dtype=torch.float32)
        except BaseException as exc:
            print(is_allocation_failure(exc), requested_bytes(exc), type(exc).__name__)
        """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    recognised, size, kind = done.stdout.split()
    assert recognised == "True", done.stdout + done.stderr
    assert size in ("40000000000", "None"), size  # the size where the allocator's message names it
    assert kind in ("RuntimeError", "MemoryError", "OutOfMemoryError")


@pytest.mark.parametrize("exc, size", [
    (RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you "
                  "tried to allocate 40000000000 bytes. Error code 12 (Cannot allocate memory)"), 40_000_000_000),
    (RuntimeError("std::bad_alloc"), None),
    (MemoryError(), None),
    (type("OutOfMemoryError", (RuntimeError,), {})("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a "
                                                   "total capacity of 79.1 GiB"), 20 * 1024**2),
])
def test_the_allocators_messages(exc, size) -> None:
    assert is_allocation_failure(exc)
    assert requested_bytes(exc) == size


def test_other_runtime_errors_are_not_allocation_failures() -> None:
    assert not is_allocation_failure(RuntimeError("shape '[2, 3]' is invalid for input of size 5"))
    assert not is_allocation_failure(ValueError("out of memory"))  # only the allocator's own error types


def test_the_cli_says_one_line_and_exits_2_when_an_allocation_fails(monkeypatch, capsys) -> None:
    def failing(args):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 16106127360 bytes. "
                           "Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(cli, "_resolved", lambda run: failing)
    assert cli.main(["validate", "specs/tiny.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "specformer validate ran out of memory: an allocation of 15.0 GiB failed" in err
    assert "ask for less" in err


def test_a_runtime_error_that_is_not_about_memory_is_not_hidden(monkeypatch) -> None:
    def failing(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli, "_resolved", lambda run: failing)
    with pytest.raises(RuntimeError, match="a bug"):
        cli.main(["validate", "specs/tiny.yaml"])
