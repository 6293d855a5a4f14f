"""The mask pictures of docs/concepts.md are the mask rule of the code, redrawn and compared byte for byte."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"

spec = importlib.util.spec_from_file_location("draw_masks", DOCS / "_hooks" / "draw_masks.py")
draw_masks = importlib.util.module_from_spec(spec)
sys.modules["draw_masks"] = draw_masks
spec.loader.exec_module(draw_masks)


def test_every_picture_is_current() -> None:
    stale = [name for name, data in draw_masks.images().items()
             if not (DOCS / "images" / name).exists() or (DOCS / "images" / name).read_bytes() != data]
    assert stale == [], f"run python docs/_hooks/draw_masks.py; stale: {stale}"


def test_drawing_is_deterministic() -> None:
    assert draw_masks.images() == draw_masks.images()


def test_concepts_shows_every_picture() -> None:
    shown = set(re.findall(r"\]\(images/(mask-[a-z]+\.png)\)", (DOCS / "concepts.md").read_text(encoding="utf-8")))
    assert shown == set(draw_masks.images())


def test_the_pictures_are_the_rule() -> None:
    """Spot checks of what each picture shows, so a wrong rule cannot pass by being redrawn."""
    masks = draw_masks.masks()
    causal, _ = masks["causal"]
    assert causal.tolist() == [[j <= i for j in range(12)] for i in range(12)]
    window, _ = masks["window"]
    assert window[11].tolist() == [False] * 8 + [True] * 4
    chunk, _ = masks["chunk"]
    assert chunk[5].tolist() == [False] * 4 + [True, True] + [False] * 6
    document, _ = masks["document"]
    assert document[4].tolist() == [False] * 3 + [True, True] + [False] * 7
    padding, pad = masks["padding"]
    assert pad.tolist() == [True] * 3 + [False] * 9
    assert not padding[3:, :3].any() and padding[:3].all()
