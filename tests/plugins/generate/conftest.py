"""Fixtures shared by the generation tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from specformer.registry.hookspecs import hookimpl
from specformer.registry.discovery import get_plugin_manager


class GenerateEndRecorder:
    """Every ``specformer_on_generate_end`` call, as ``(tokens, seconds)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, float]] = []

    @hookimpl
    def specformer_on_generate_end(self, tokens: int, seconds: float) -> None:
        self.calls.append((tokens, seconds))


@pytest.fixture
def recorder() -> Iterator[GenerateEndRecorder]:
    """A :class:`GenerateEndRecorder` registered with the plugin manager for the test."""
    manager = get_plugin_manager()
    rec = GenerateEndRecorder()
    manager.register(rec, name="test-generate-end-recorder")
    yield rec
    manager.unregister(rec)
