"""Shared fixtures of the text plugin's tests: a small real-looking corpus, and a token cache of each test's own."""

from __future__ import annotations

import pytest

from fixtures.corpus import _private_cache, corpus_dir  # noqa: F401  (fixtures of this folder)


@pytest.fixture(autouse=True)
def _tiny_models_on_one_thread(one_thread: None) -> None:
    """Every test on one thread (tests/conftest.py's ``one_thread``): some train the tiny model on a source."""
