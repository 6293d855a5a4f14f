"""What reading a checkpoint's files can refuse: a damaged file and weights that do not fit the model.

Below both :mod:`specformer_train.checkpointing` and :mod:`specformer_train.sharded_checkpoint`,
which read full and sharded checkpoints alike through these, so neither imports the other to
refuse.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specformer.errors import CheckpointError


class DamagedCheckpoint(CheckpointError):
    """A checkpoint file is missing, truncated or not what it should be; the message names the file."""


def parse_json(text: str, *, where: str) -> Any:
    """``text`` (a checkpoint's JSON) parsed; every way it fails to parse is a :class:`DamagedCheckpoint` naming ``where``.

    Nesting deep enough to overflow the parser (a RecursionError) included: ``--resume`` falls back past
    a damaged checkpoint only when reading it raises this one error.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise DamagedCheckpoint(f"{where}: not readable JSON (nested too deeply to parse)") from None
    except ValueError as exc:  # json.JSONDecodeError
        raise DamagedCheckpoint(f"{where}: not readable JSON ({exc})") from None


def read_json(path: Path) -> Any:
    """The JSON file ``path`` of a checkpoint, parsed (:func:`parse_json`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DamagedCheckpoint(f"{path}: not readable JSON ({exc})") from None
    return parse_json(text, where=str(path))


def refuse_misfit(expected: dict[str, tuple], got: dict[str, tuple], *, where: str) -> None:
    """A CheckpointError naming what ``got`` (stored names and shapes) lacks, adds or shapes otherwise than the model."""
    if expected == got:
        return
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    shaped = sorted(f"{n} {got[n]} vs {expected[n]}" for n in set(got) & set(expected) if got[n] != expected[n])
    raise CheckpointError(
        f"{where}: does not fit the model of this spec (missing {missing or 'none'}, unexpected "
        f"{extra or 'none'}, mis-shaped {shaped or 'none'}); resume with the spec the run was started with"
    )
