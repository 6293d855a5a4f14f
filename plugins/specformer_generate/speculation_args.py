"""The check of ``generate(draft=...)``: which drafter, and whether it can serve this model and call."""

from __future__ import annotations

from typing import Any

import torch

from specformer_generate.arguments import check_mode
from specformer_generate.drafters import DraftModel, MTPDrafter, PromptLookup
from specformer_generate.samplers.pipeline import Sampler
from specformer_generate.speculative import MTP_NAMES, PROMPT_LOOKUP_NAMES, Drafter


def speculation_drafter(model: Any, draft: Any, *, sampler: Sampler, use_cache: bool, compile: Any,
                        needed: int) -> Drafter:
    """The drafter for ``draft`` (``"ngram"``, ``"mtp"`` or a model), or a ValueError naming what does not fit.

    ``needed``: the columns the call writes (longest prompt plus new tokens), which the
    draft model's context must hold.
    """
    if not use_cache:
        raise ValueError("draft= (speculative decoding) checks drafts against the KV cache; it needs use_cache=True")
    if compile:
        raise ValueError("draft= (speculative decoding) runs uncompiled forwards of several tokens; "
                         "drop compile or draft")
    if sampler.chooser is not None and not sampler.is_greedy:
        raise ValueError(f"draft= needs a sampler that draws from the processed distribution or takes its argmax; "
                         f"{sampler.chooser!r} chooses tokens its own way, so drafts cannot be checked against it")
    if isinstance(draft, str):
        if draft in PROMPT_LOOKUP_NAMES:
            return PromptLookup()
        if draft in MTP_NAMES:
            if getattr(model, "mtp", None) is None:
                raise ValueError(f"draft 'mtp' drafts with the model's multi-token prediction depths (model.mtp in "
                                 f"its spec), and this model ({type(model).__name__}, {len(model.blocks)} layers) has "
                                 f"none; use 'ngram' (prompt lookup) or a smaller draft model with the same vocabulary")
            return MTPDrafter(model)
        raise ValueError(f"draft must be 'ngram' (prompt lookup), 'mtp' (the model's MTP depths) or a draft model, "
                         f"got the string {draft!r}")
    if not isinstance(draft, torch.nn.Module) or not hasattr(draft, "vocab_size"):
        raise ValueError(f"draft must be 'ngram' (prompt lookup), 'mtp' (the model's MTP depths) or a specformer "
                         f"model, got {type(draft).__name__}")
    if draft is model:
        raise ValueError("draft is the model itself, which would only add work; pass a smaller model, 'ngram', or 'mtp' "
                         "(the model's own MTP depths)")
    if draft.vocab_size != model.vocab_size:
        raise ValueError(f"the draft model's vocabulary has {draft.vocab_size} tokens but the model's has "
                         f"{model.vocab_size}; a draft model must use the same tokenizer and vocabulary")
    if draft.context_length < needed:
        raise ValueError(f"the draft model's context length ({draft.context_length}) is shorter than the "
                         f"{needed} tokens of prompt and output; use a draft with a longer context or fewer tokens")
    device, draft_device = next(model.parameters()).device, next(draft.parameters()).device
    if device != draft_device:
        raise ValueError(f"the draft model is on {draft_device} but the model is on {device}; move one of them")
    check_mode(draft)
    return DraftModel(draft)

