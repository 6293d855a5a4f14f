"""Writing a run's files so that a crash never leaves a half-written file where a good one was.

The mechanism (temporary siblings unique to the process, flushed, renamed into place) is
the core's :mod:`specformer.files.atomic`, shared with every plugin that writes files.
"""

from __future__ import annotations

from specformer.files.atomic import copy_file_atomic, fsync_dir, fsync_file, temp_sibling, unique_suffix, write_text_atomic
from specformer.errors import UserError


class OutputError(UserError):
    """A file of the run could not be written (disk full, read-only, ...); what was there is intact."""


__all__ = ["OutputError", "copy_file_atomic", "fsync_dir", "fsync_file", "temp_sibling", "unique_suffix",
           "write_text_atomic"]
