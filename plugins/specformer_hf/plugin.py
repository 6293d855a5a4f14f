"""Hook implementations of the hf plugin."""

from __future__ import annotations
