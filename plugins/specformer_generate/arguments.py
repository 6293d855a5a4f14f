"""Checks of ``generate()``'s and ``stream()``'s arguments: one clear ValueError each, never a raw TypeError.

:func:`check_mode` checks the model itself (no dropout in training mode); a session and a
draft model are checked by it too.

Each function returns the value in the form the loop uses (``eos_ids`` a list of ids,
``stop_sequences`` a list of id lists) or raises a ``ValueError`` naming the argument,
what it got (shortened) and what is accepted.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_list(value: Any) -> list[Any] | None:
    """A list of the items of a list, tuple or 1-d tensor; None for anything else (strings included)."""
    if isinstance(value, Tensor):
        return value.tolist() if value.dim() == 1 else None
    if isinstance(value, (list, tuple)):
        return list(value)
    return None


def eos_ids(value: Any) -> list[int]:
    """``eos_token_id``: None, a token id >= 0, or a list of them."""
    if value is None:
        return []
    ids = [value] if _is_int(value) else _as_list(value)
    if ids is None or not all(_is_int(i) for i in ids):
        raise ValueError(f"eos_token_id must be a token id (an int) or a list of them, got {_shown(value)}"
                         + ("; encode text with the tokenizer first" if isinstance(value, str) else ""))
    negative = [i for i in ids if i < 0]
    if negative:  # an id past the vocabulary is allowed (it never ends a row); a negative one is a mistake
        raise ValueError(f"eos_token_id must hold token ids >= 0, got {negative[0]}")
    return ids


def pad_id(value: Any, eos: list[int]) -> int:
    """``pad_token_id``: any int (negative ids are fine as markers); default the first eos id, else -1."""
    if value is None:
        return eos[0] if eos else -1
    if not _is_int(value):
        raise ValueError(f"pad_token_id must be an int (any value, e.g. -1), got {_shown(value)}")
    return value


def stop_sequences(value: Any) -> list[list[int]]:
    """``stop``: None or a list of non-empty token-id lists."""
    if value is None:
        return []
    sequences = _as_list(value)
    hint = "; stop takes token ids, e.g. stop=[[13, 10]] (encode text with the tokenizer first)"
    if sequences is None:
        raise ValueError(f"stop must be a list of token-id lists, got {_shown(value)}{hint}")
    checked = []
    for i, sequence in enumerate(sequences):
        ids = _as_list(sequence)
        if ids is None or not all(_is_int(t) for t in ids):
            raise ValueError(f"stop[{i}] must be a list of token ids, got {_shown(sequence)}{hint}")
        if not ids:
            raise ValueError(f"stop[{i}] is an empty sequence; every stop sequence needs at least one token")
        checked.append(ids)
    return checked


def positive_int(name: str, value: Any) -> int:
    if not _is_int(value) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {_shown(value)}")
    return value


def seed(value: Any) -> int | None:
    if value is not None and not _is_int(value):
        raise ValueError(f"seed must be an int or None, got {_shown(value)}")
    return value


def finite_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {_shown(value)}")
    return float(value)


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {_shown(value)}")
    return value


def compile_option(value: Any) -> bool | str:
    if not isinstance(value, (bool, str)):
        raise ValueError(f"compile must be True, False or a torch.compile backend name, got {_shown(value)}")
    return value


def early_stopping(value: Any) -> bool | str:
    if value is True or value is False or value == "never":
        return value
    raise ValueError(f"early_stopping must be True, False or 'never', got {_shown(value)}")

def check_mode(model: Any) -> None:
    """A ValueError when a module of ``model`` is in training mode with dropout that would apply."""
    for name, module in model.named_modules():
        if not module.training:
            continue
        rate = module.p if isinstance(module, torch.nn.modules.dropout._DropoutNd) else getattr(module, "dropout", None)
        if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate > 0:
            raise ValueError(
                f"the model is in training mode and {name or 'the model'} applies dropout ({rate}), which would make "
                f"generation random; call model.eval() before generating (generate never switches the mode itself, "
                f"so that other threads using the model are not affected)"
            )
