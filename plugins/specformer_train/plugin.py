"""Hook implementations of the train plugin."""

from __future__ import annotations
