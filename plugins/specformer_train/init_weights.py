"""``train.init`` / ``--init CKPT``: start a run from a checkpoint's weights and tokenizer (fine-tuning).

The spec's model must be the checkpoint's (compared section by section after both are
validated, so defaults written out or left implicit do not matter); the model is built
from the run's spec and the checkpoint's tensors are copied in, then held in float32
like any run's weights. Only a plain checkpoint can seed a run: a quantized one or an
adapter is refused with what to do instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch

import specformer
from specformer.checkpoint.save_load import load_weights, read_tensors
from specformer.checkpoint.check import check_checkpoint
from specformer.checkpoint.locate import resolve_checkpoint
from specformer.errors import CheckpointError, UserError
from specformer.spec import Spec
from specformer.tokenizers.tokenizer import Tokenizer
from specformer.tokenizers.choice import checkpoint_tokenizer


@dataclass
class InitCheckpoint:
    model: torch.nn.Module
    tokenizer: Tokenizer
    metadata: dict[str, str]


def load_init(path: str, spec: Spec) -> InitCheckpoint:
    """The run's model with ``path``'s weights, and ``path``'s tokenizer; UserError when they cannot be used."""
    try:
        path = str(resolve_checkpoint(path))  # a run's step-N directory, or a run directory: its checkpoint file
        checked = check_checkpoint(path)
    except CheckpointError as exc:
        raise UserError(f"train.init: {exc}") from None
    if checked.stored is not None:
        raise UserError(f"train.init: {path} stores its weights in another layout (quantized, or an adapter); start "
                        f"from a plain float checkpoint (for an adapter: `specformer merge {path} -o OUT.safetensors`)")
    ours, theirs = spec.to_dict()["model"], checked.spec.to_dict()["model"]
    if ours != theirs:
        differing = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        shown = "; ".join(f"model.{k}: spec {json.dumps(ours.get(k))[:80]}, checkpoint {json.dumps(theirs.get(k))[:80]}"
                          for k in differing[:4])
        raise UserError(f"train.init: the spec's model is not the model of {path} ({shown}); fine-tune with the "
                        f"checkpoint's own spec (`specformer hf import` writes it beside the checkpoint)")
    try:  # the rule every command uses: a 259-token model without a tokenizer entry is byte-level
        tokenizer = checkpoint_tokenizer(checked.metadata, vocab_size=checked.spec.model.vocab_size, where=str(path))
    except UserError as exc:
        raise UserError(f"train.init: {exc}") from None
    model = specformer.build(spec, init=False)  # every tensor is about to be copied in
    try:
        load_weights(model, read_tensors(path), where=str(path))
    except CheckpointError as exc:
        raise UserError(f"train.init: {exc}") from None
    return InitCheckpoint(model=model.float(), tokenizer=tokenizer, metadata=dict(checked.metadata))


__all__ = ["InitCheckpoint", "load_init"]
