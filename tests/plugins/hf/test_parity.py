"""Every family against transformers itself: logits, greedy generation, export, and bit-exact round trips.

Each case is a tiny random model built and saved locally with transformers (see hf_cases.py),
imported with specformer_hf, and compared with the transformers model it came from.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hf_cases import SEQ_LEN
from safetensors.torch import load_file

import specformer_hf

TOLERANCE = 1e-4  # fp32 logits, max abs difference
NEW_TOKENS = 32


def _inputs(model, *, batch: int = 2, length: int = SEQ_LEN, seed: int = 1):
    generator = torch.Generator().manual_seed(seed)
    # Past the context length of llama-rope-dynamic (16): the plain forward goes there as transformers does.
    return torch.randint(0, model.vocab_size, (batch, length), generator=generator)


def test_logits_match_transformers(saved):
    ids = _inputs(saved.model)
    with torch.no_grad():
        reference = saved.hf(ids).logits
        ours = saved.model(ids)
    assert ours.shape == reference.shape
    assert reference.abs().max() > 0.5, "degenerate logits would make the comparison meaningless"
    assert (ours - reference).abs().max().item() <= TOLERANCE


def test_greedy_generation_matches_transformers(saved):
    if saved.case.no_generate:
        pytest.skip(saved.case.no_generate)
    from specformer_generate import generate

    prompt = _inputs(saved.model, length=8, seed=2)
    # Where transformers' batched decode is wrong (Case.generate_row_by_row), each row alone is its reference.
    rows = [prompt[i:i + 1] for i in range(len(prompt))] if saved.case.generate_row_by_row else [prompt]
    with torch.no_grad():
        reference = torch.cat([saved.hf.generate(row, attention_mask=torch.ones_like(row), do_sample=False,
                                                 max_new_tokens=NEW_TOKENS, pad_token_id=0) for row in rows])
    ours = generate(saved.model, prompt, max_new_tokens=NEW_TOKENS)
    assert reference.shape == (2, 8 + NEW_TOKENS)
    assert torch.equal(ours, reference)


def test_export_loads_in_transformers_with_the_same_logits(saved, tmp_path):
    from transformers import AutoModelForCausalLM

    out = specformer_hf.to_hf(saved.model, tmp_path / "export")
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(reloaded).__name__ == type(saved.hf).__name__
    ids = _inputs(saved.model, seed=3)
    with torch.no_grad():
        assert (reloaded(ids).logits - saved.hf(ids).logits).abs().max().item() <= TOLERANCE


def test_import_export_import_is_bit_exact(saved, tmp_path):
    out = specformer_hf.to_hf(saved.model, tmp_path / "export")
    again = specformer_hf.import_hf(out)
    assert again.family.model_type == saved.imported.family.model_type
    assert again.model.spec.to_dict() == saved.model.spec.to_dict()
    ours, theirs = saved.model.state_dict(), again.model.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert ours[name].dtype == theirs[name].dtype and torch.equal(ours[name], theirs[name]), name
    # The exported file holds exactly the tensors transformers saved, bit for bit.
    original, exported = load_file(saved.directory / "model.safetensors"), load_file(out / "model.safetensors")
    assert original.keys() == exported.keys()
    for name in original:
        assert torch.equal(original[name], exported[name]), name


def test_dynamic_rope_past_the_context_recomputes_its_frequencies_as_transformers_does(saved_rope_dynamic):
    """A plain forward of 24 tokens through a model of context 16: no refusal, no warning (dynamic scaling
    keeps adapting), and theta follows the length of the forward, so even the first 16 tokens' logits change.

    transformers keeps the frequencies of the longest forward it has seen until one shorter than the
    original context resets them, where specformer takes each forward's own length; so the transformers
    side runs on a reset model, the shorter forward first.
    """
    model, hf = saved_rope_dynamic.model, saved_rope_dynamic.hf
    assert model.context_length == 16 and model.past_context()[0] == "yes"
    ids = _inputs(model, length=24, seed=4)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")
        hf(ids[:, :8])  # under 16 tokens: transformers goes back to the original frequencies
        short, short_reference = model(ids[:, :16]), hf(ids[:, :16]).logits
        ours, reference = model(ids), hf(ids).logits
    assert (ours - reference).abs().max().item() <= TOLERANCE
    assert (short - short_reference).abs().max().item() <= TOLERANCE
    assert (ours[:, :16] - short).abs().max().item() > 100 * TOLERANCE  # the frequencies of length 24, not 16
