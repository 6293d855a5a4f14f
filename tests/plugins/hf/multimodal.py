"""A multimodal checkpoint read for its language model: the shared check of the families that read one."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

import specformer_hf

TOLERANCE = 1e-4


def check_language_model_import(hf: Any, directory: Path, *, model_type: str, text_class: str) -> None:
    """``hf`` (a ...ForConditionalGeneration, its weights shaken) saved, imported as its language model with the
    same logits (head tied at the top level), exported as ``text_class`` with the same logits again."""
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(directory / "hf")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no tokenizer.json")
        imported = specformer_hf.import_hf(directory / "hf")
    assert imported.family.model_type == model_type and imported.model.spec.model.tie_embeddings
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        reference = hf(input_ids=ids).logits
        assert (imported.model(ids) - reference).abs().max().item() <= TOLERANCE
    out = specformer_hf.to_hf(imported.model, directory / "export")
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == text_class  # the language model alone
    with torch.no_grad():
        assert (reloaded(ids).logits - reference).abs().max().item() <= TOLERANCE
