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
