"""The error of a file the text services (or a plugin using them) could not write.

The writing itself is the core's :mod:`specformer.files.atomic` (temporary siblings, flushed,
renamed into place); this is the one message a command gives when that fails.
"""

from __future__ import annotations

from specformer.errors import UserError


class OutputError(UserError):
    """A file could not be written (disk full, read-only, ...); what was there is intact."""
