"""build() refuses a model larger than the memory limit, before allocating, and says how to override."""

from __future__ import annotations

import copy

import pytest

import specformer
from specformer.errors import InputError, MemoryLimitError
from specformer.machine.memory import ENV_VAR, available_memory, check_memory, memory_limit, parse_bytes
from specformer.spec.check import estimate

from conftest import TINY


@pytest.mark.parametrize("text, expected", [
    ("1024", 1024), ("64G", 64 * 1024**3), ("512MiB", 512 * 1024**2), ("1.5T", int(1.5 * 1024**4)),
    ("2kib", 2048), ("2kb", 2000), ("500MB", 500 * 1000**2), (" 7 g ", 7 * 1024**3), ("1e10", 10**10),
    ("unlimited", None), ("none", None),
])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "-5G", "0", "12 parsecs", "G", "1e400"])
def test_parse_bytes_refuses_what_is_not_a_size(text):
    with pytest.raises(InputError, match=ENV_VAR):
        parse_bytes(text)


def test_available_memory_on_cpu_is_known_and_meta_is_unchecked(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert available_memory("cpu") > 0
    assert memory_limit("meta")[0] is None
    check_memory(10**30, what="a meta build", device="meta")


def test_build_refuses_over_the_limit_with_the_size_and_the_override(monkeypatch):
    needed = estimate(TINY).total_bytes()
    monkeypatch.setenv(ENV_VAR, str(needed - 1))
    with pytest.raises(MemoryLimitError) as info:
        specformer.build(TINY)
    message = str(info.value)
    assert f"{needed:,} bytes" in message and ENV_VAR in message and "--max-memory" in message
    monkeypatch.setenv(ENV_VAR, str(needed))
    model = specformer.build(TINY)
    assert sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
        b.numel() * b.element_size() for b in model.buffers()) == needed


def test_a_huge_spec_is_refused_by_the_machine_limit_before_allocating(monkeypatch):
    """Without the env var, the limit is what the machine has: a 1-trillion-layer toy does not fit anywhere."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    spec = copy.deepcopy(TINY)
    spec["model"]["n_layers"] = 10**12
    with pytest.raises(MemoryLimitError, match="building this model needs"):
        specformer.build(spec)


def test_meta_builds_are_not_limited(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "1")
    assert specformer.build(TINY, device="meta").embedding.weight.is_meta


def test_a_bad_env_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(ENV_VAR, "plenty")
    with pytest.raises(InputError, match="is not a size"):
        specformer.build(TINY)


def _fake_proc(tmp_path, *, cgroup: str, status: str = "VmSize:\t  102400 kB\n"):
    """A made-up /proc/self and /sys/fs/cgroup, so the limits read below are the test's own."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "status").write_text(status)
    root = tmp_path / "cgroup"
    root.mkdir()
    return proc, root


def _limit_with(monkeypatch, proc, root, *, meminfo_available: int = 64 * 1024**3, rlimit_as=None):
    from specformer.machine import memory

    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.setattr(memory, "PROC_SELF", proc)
    monkeypatch.setattr(memory, "CGROUP_ROOT", root)
    monkeypatch.setattr(memory, "_memory_available", lambda: meminfo_available)
    import resource
    real = resource.getrlimit
    as_limit = (rlimit_as, rlimit_as) if rlimit_as is not None else (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(resource, "getrlimit", lambda which: as_limit if which == resource.RLIMIT_AS else real(which))
    return memory_limit("cpu")


def test_a_cgroup_v2_memory_max_is_the_limit_less_what_the_group_uses(tmp_path, monkeypatch):
    proc, root = _fake_proc(tmp_path, cgroup="0::/user.slice/job\n")
    group = root / "user.slice" / "job"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(f"{2 * 1024**3}\n")
    (group / "memory.current").write_text(f"{512 * 1024**2}\n")
    limit, source = _limit_with(monkeypatch, proc, root)
    assert limit == 2 * 1024**3 - 512 * 1024**2
    assert "control group" in source
    # "max" means no limit: what /proc/meminfo says is the limit again.
    (group / "memory.max").write_text("max\n")
    assert _limit_with(monkeypatch, proc, root) == (64 * 1024**3, "available on cpu")


def test_a_cgroup_v1_limit_is_read_also_where_the_container_mounts_its_group_as_the_root(tmp_path, monkeypatch):
    proc, root = _fake_proc(tmp_path, cgroup="12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    memory_root = root / "memory"  # a container sees its own group at the controller's root
    memory_root.mkdir()
    (memory_root / "memory.limit_in_bytes").write_text(f"{3 * 1024**3}\n")
    (memory_root / "memory.usage_in_bytes").write_text(f"{1024**3}\n")
    assert _limit_with(monkeypatch, proc, root)[0] == 2 * 1024**3
    # v1 writes "no limit" as a number near 2**63.
    (memory_root / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert _limit_with(monkeypatch, proc, root)[0] == 64 * 1024**3


def test_ulimit_v_is_the_limit_less_the_address_space_already_mapped(tmp_path, monkeypatch):
    proc, root = _fake_proc(tmp_path, cgroup="0::/\n", status="Name:\tpython\nVmSize:\t 1048576 kB\n")
    limit, source = _limit_with(monkeypatch, proc, root, rlimit_as=5 * 1024**3)
    assert limit == 4 * 1024**3  # 5 GiB allowed, 1 GiB already mapped
    assert "ulimit -v" in source
    # The smallest limit wins, whichever it is.
    assert _limit_with(monkeypatch, proc, root, rlimit_as=5 * 1024**3, meminfo_available=1024**3) == (
        1024**3, "available on cpu")


def test_a_refusal_names_the_limit_that_refused(tmp_path, monkeypatch):
    proc, root = _fake_proc(tmp_path, cgroup="0::/\n", status="VmSize:\t 0 kB\n")
    _limit_with(monkeypatch, proc, root, rlimit_as=1024**3)
    with pytest.raises(MemoryLimitError, match=r"ulimit -v.*SPECFORMER_MAX_MEMORY"):
        check_memory(2 * 1024**3, what="this test")
