"""Draw docs/images/mask-*.png from the mask rule itself, as the kernels evaluate it, one picture per mask.

Rows are queries, columns keys, both in token order; a filled cell is a key the query
may read. Every picture is the dense form of the rule (specformer.model.masks.MaskRule) as
specformer_layers.attention.masking evaluates it for every kernel, so the pictures
cannot drift from the code: tests/docs/test_mask_images.py redraws them and compares
bytes. Regenerate after changing the rule:

    python docs/_hooks/draw_masks.py

PNG is written by hand (zlib, no image library, no timestamps): the same mask always
gives the same bytes.
"""

from __future__ import annotations

import struct
import sys
import zlib
from pathlib import Path

import torch

from specformer.model.masks import MaskRule
from specformer_layers.attention.masking import dense_mask, mask_inputs

IMAGES = Path(__file__).resolve().parent.parent / "images"
T = 12
CELL, GAP = 14, 2
ALLOWED = (37, 99, 235)  # blue
MASKED = (229, 231, 235)  # light grey
PADDING = (254, 215, 170)  # orange: a padding token's row or column
BACKGROUND = (255, 255, 255)


def masks() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (allowed (T, T) bool, padding (T,) bool), each from the kernels' evaluation of the rule."""
    arange = torch.arange(T)[None]  # (1, T)
    documents = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2]])
    padded = (arange - 3).clamp(min=-1)  # a left-padded row: three padding tokens, then positions 0..8
    cases = {
        "causal": (arange, None, MaskRule()),
        "window": (arange, None, MaskRule(window=4)),
        "chunk": (arange, None, MaskRule(chunk=4)),
        "document": (arange, documents, MaskRule()),
        "padding": (padded, None, MaskRule()),
    }
    out = {}
    for name, (positions, document_ids, rule) in cases.items():
        allowed = dense_mask(mask_inputs(positions, positions, document_ids=document_ids, same_tokens=True), rule)
        out[name] = (allowed[0, 0], positions[0] < 0)
    return out


def png(allowed: torch.Tensor, padding: torch.Tensor) -> bytes:
    """The grid as an RGB PNG: a CELL-pixel square per (query, key), GAP pixels between."""
    n = allowed.shape[0]
    size = n * (CELL + GAP) + GAP
    rows = []
    for y in range(size):
        line = bytearray([0])  # filter type 0 (none) for every scanline
        i, in_cell_y = divmod(y - GAP, CELL + GAP)
        for x in range(size):
            j, in_cell_x = divmod(x - GAP, CELL + GAP)
            inside = y >= GAP and x >= GAP and in_cell_y < CELL and in_cell_x < CELL
            if not inside:
                colour = BACKGROUND
            elif bool(padding[i]) or bool(padding[j]):
                # A padding query reads everything only to stay finite, a padding key is never read.
                colour = PADDING if not allowed[i, j] or bool(padding[i]) else ALLOWED
            else:
                colour = ALLOWED if bool(allowed[i, j]) else MASKED
            line += bytes(colour)
        rows.append(bytes(line))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)  # 8-bit RGB
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"".join(rows), 9))
            + chunk(b"IEND", b""))


def images() -> dict[str, bytes]:
    """File name -> PNG bytes of every mask picture."""
    return {f"mask-{name}.png": png(allowed, padding) for name, (allowed, padding) in masks().items()}


def main() -> int:
    IMAGES.mkdir(exist_ok=True)
    for name, data in images().items():
        (IMAGES / name).write_bytes(data)
        print(f"wrote docs/images/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
