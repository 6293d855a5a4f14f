"""Which linear layers an adapter wraps: the model's own module paths, matched segment by segment.

A target is a dotted path whose segments are shell patterns: ``*`` (or ``?``, ``[...]``)
inside one segment, so ``blocks.*.mixer.qkv`` names the fused QKV projection of every
block and ``blocks.*.ffn.*`` every linear layer of every FFN; a whole segment ``**``
matches any number of segments (``**.down``). Only linear layers (``nn.Linear`` or a
quantized one) can be targets; a pattern that matches none is an error naming what the
model has.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

from torch import nn


def is_linear(module: nn.Module) -> bool:
    """An ``nn.Linear`` or a layer standing for one (a quantized linear: ``in_features`` and ``out_features``)."""
    if isinstance(module, nn.Linear):
        return True
    return hasattr(module, "qweight") and hasattr(module, "in_features")  # the quant plugin's QuantizedLinear


def matches(pattern: str, name: str) -> bool:
    """Whether the dotted module path ``name`` matches ``pattern`` (``*`` within a segment, ``**`` across)."""
    return _match(pattern.split("."), name.split("."))


def _match(pattern: list[str], parts: list[str]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatchcase(parts[0], head) and _match(rest, parts[1:])


def select_targets(model: nn.Module, patterns: list[str]) -> list[str]:
    """The names of the linear layers ``patterns`` match, in module order; ValueError for a pattern matching none."""
    linears = [name for name, module in model.named_modules() if name and is_linear(module)]
    chosen: set[str] = set()
    for pattern in patterns:
        found = [name for name in linears if matches(pattern, name)]
        if not found:
            shown = sorted({_generalise(n) for n in linears})
            raise ValueError(f"target {pattern!r} matches no linear layer of this model; its linear layers are "
                             f"{', '.join(shown)}")
        chosen.update(found)
    return [name for name in linears if name in chosen]


def _generalise(name: str) -> str:
    """``blocks.3.ffn.down`` -> ``blocks.*.ffn.down`` (how the error lists the model's layers)."""
    return ".".join("*" if part.isdigit() else part for part in name.split("."))
