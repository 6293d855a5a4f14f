"""The ``specformer`` console script, kept apart from the package it starts.

Importing :mod:`specformer` imports PyTorch and every plugin, which takes seconds; a
Ctrl-C in that time would otherwise end in Python's traceback, before
:func:`specformer.cli.main` (which handles Ctrl-C itself) has started. This module
imports nothing heavy, so the whole start-up is covered.
"""

from __future__ import annotations

import sys

INTERRUPTED = 130  # the shell's code for a process ended by SIGINT


def main() -> int:
    """Import the CLI and run it; Ctrl-C while importing is one line and exit code 130."""
    try:
        from specformer.cli.main import main as run  # late: a Ctrl-C during this import is caught below
    except KeyboardInterrupt:
        print("specformer: interrupted", file=sys.stderr)
        return INTERRUPTED
    return run()
