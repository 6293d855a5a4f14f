"""Against Hugging Face transformers on a tiny Llama with copied weights: logits, greedy, processors, beams."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_generate import generate

from .llama_reference import LLAMA_SPEC, hf_llama_from
from .specs_for_tests import assert_not_degenerate

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def pair():
    ours = specformer.build(LLAMA_SPEC, seed=0).eval()
    return ours, hf_llama_from(ours)


@pytest.fixture(scope="module")
def pair64(pair):
    # float64 on both sides: equal scores then pick equal tokens, ties aside.
    ours, theirs = pair
    return specformer.build(LLAMA_SPEC, seed=0).double().eval(), hf_llama_from(ours).double()


def prompts(seed: int, batch: int = 2, length: int = 6) -> torch.Tensor:
    return torch.randint(0, LLAMA_SPEC["model"]["vocab_size"], (batch, length), generator=torch.Generator().manual_seed(seed))


def hf_generate(hf, ids: torch.Tensor, **kwargs):
    kwargs.setdefault("attention_mask", torch.ones_like(ids))
    return hf.generate(ids, do_sample=False, **kwargs)


def test_the_reference_llama_has_our_logits(pair) -> None:
    ours, theirs = pair
    ids = prompts(0, batch=3, length=40)
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids).logits, rtol=0, atol=1e-4)


def test_greedy_matches_transformers(pair64) -> None:
    ours, theirs = pair64
    ids = prompts(1, batch=3)
    out = generate(ours, ids, max_new_tokens=20)
    assert torch.equal(out, hf_generate(theirs, ids, max_new_tokens=20))
    assert_not_degenerate(out, ids)


def test_left_padded_greedy_matches_transformers(pair64) -> None:
    ours, theirs = pair64
    rows = [[5, 8, 13, 21, 34, 55], [7, 3], [2, 4, 6, 8]]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    theirs_out = hf_generate(theirs, ids, attention_mask=mask, max_new_tokens=12, pad_token_id=0)
    ours_out = generate(ours, rows, max_new_tokens=12)
    assert [r[len(p):] for r, p in zip(ours_out, rows)] == theirs_out[:, width:].tolist()
    assert_not_degenerate(ours_out, rows)


def test_processors_then_greedy_match_transformers(pair64) -> None:
    ours, theirs = pair64
    ids = prompts(2, batch=2, length=8)
    sampler = [{"kind": "repetition_penalty", "penalty": 1.5}, {"kind": "no_repeat_ngram", "n": 2}, "greedy"]
    expected = hf_generate(theirs, ids, max_new_tokens=25, repetition_penalty=1.5, no_repeat_ngram_size=2)
    assert torch.equal(generate(ours, ids, max_new_tokens=25, sampler=sampler), expected)


def likely_eos(ours, ids: torch.Tensor, steps: tuple[int, ...]) -> list[int]:
    """End tokens the model actually produces early, so that beams really finish."""
    free = generate(ours, ids, max_new_tokens=max(steps) + 2)
    return sorted({int(free[row % ids.shape[0], ids.shape[1] + s]) for row, s in enumerate(steps)})


BEAM_CASES = [
    (2, 1.0, False),
    (3, 1.0, False),
    (4, 0.5, True),
    (3, 2.0, "never"),
    (3, -1.0, False),
    (5, 0.0, "never"),
    (4, 1.5, True),
]


@pytest.mark.parametrize("num_beams, length_penalty, early_stopping", BEAM_CASES)
def test_beam_search_matches_transformers(pair64, num_beams, length_penalty, early_stopping) -> None:
    ours, theirs = pair64
    ids = prompts(10 + num_beams)
    settings = dict(max_new_tokens=12, num_beams=num_beams, length_penalty=length_penalty, early_stopping=early_stopping)
    # Without an end token every beam runs to max_new_tokens.
    out = generate(ours, ids, **settings)
    assert torch.equal(out, hf_generate(theirs, ids, **settings))
    assert_not_degenerate(out, ids)
    # With end tokens the model emits, beams finish at different lengths. transformers pads a
    # finished row with the first eos id when pad_token_id is falsy, so pad with it on both sides.
    eos = likely_eos(ours, ids, (1, 3, 4))
    expected = hf_generate(theirs, ids, eos_token_id=eos, pad_token_id=eos[0], **settings)
    assert torch.equal(generate(ours, ids, eos_token_id=eos, pad_token_id=eos[0], **settings), expected)


def test_beam_search_with_processors_matches_transformers(pair64) -> None:
    ours, theirs = pair64
    ids = prompts(20)
    eos = likely_eos(ours, ids, (2, 5))
    settings = dict(max_new_tokens=14, num_beams=3, eos_token_id=eos, pad_token_id=eos[0])
    sampler = [{"kind": "no_repeat_ngram", "n": 2}, {"kind": "repetition_penalty", "penalty": 1.3}]
    expected = hf_generate(theirs, ids, no_repeat_ngram_size=2, repetition_penalty=1.3, **settings)
    assert torch.equal(generate(ours, ids, sampler=sampler, **settings), expected)


def test_beam_search_rows_are_independent_of_padding_and_cache(pair64) -> None:
    ours, _ = pair64
    rows = [[5, 8, 13, 21, 34, 55, 1], [7, 3], [2, 4, 6, 8]]
    settings = dict(max_new_tokens=10, num_beams=3, length_penalty=1.0)
    batched = generate(ours, rows, **settings)
    assert batched == [generate(ours, [r], **settings)[0] for r in rows]
    assert batched == generate(ours, rows, use_cache=False, **settings)


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy(pair64) -> None:
    """Length penalty 0 scores by total log-probability, which greedy cannot beat."""
    ours, _ = pair64
    ids = prompts(30, batch=1)

    def log_prob(seq: torch.Tensor) -> float:
        with torch.no_grad():
            logp = torch.log_softmax(ours(seq[None])[0, :-1].float(), dim=-1)
        picked = logp[torch.arange(seq.numel() - 1), seq[1:]]
        return float(picked[ids.shape[1] - 1 :].sum())

    greedy = generate(ours, ids, max_new_tokens=8)[0]
    beam = generate(ours, ids, max_new_tokens=8, num_beams=4, length_penalty=0.0, early_stopping="never")[0]
    assert log_prob(beam) >= log_prob(greedy) - 1e-6
