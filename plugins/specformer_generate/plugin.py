"""Hook implementations of the generate plugin."""

from __future__ import annotations
