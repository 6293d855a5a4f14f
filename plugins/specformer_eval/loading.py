"""A checkpoint's model, loaded for evaluation and inspection.

The tokenizer its text is encoded with is chosen as every command chooses it, by
:func:`specformer.tokenizers.choice.checkpoint_tokenizer` (``--tokenizer FILE`` overrides it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import specformer
from specformer.machine.devices import parse_device


def load_model(checkpoint: str | Path, *, device: str | torch.device = "cpu") -> Any:
    """The model of ``checkpoint`` on ``device``, in evaluation mode."""
    device = parse_device(str(device)) if isinstance(device, str) else device
    return specformer.load(checkpoint, device=device).eval()
