"""Speculative decoding's verify step and loop: what the mutation run found unpinned.

``verify`` is driven directly with hand-made distributions (the formula written in the test:
softmax with NaN as no mass, the exponential race for a draw, ``max(0, p - q)`` for a
replacement), and the loop through ``generate`` for what only it shows: a seeded run
does not read torch's global random state, and every tensor lands on the prompts' device.
"""

from __future__ import annotations

import copy

import pytest
import torch

import specformer
from specformer.registry.hookspecs import hookimpl
from specformer.registry.discovery import get_plugin_manager
from specformer_generate import generate, stream
from specformer_generate.samplers.pipeline import Sampler
from specformer_generate.speculative import Draft, probabilities, verify

from .specs_for_tests import assert_not_degenerate, tiny_with

GREEDY = Sampler((), greedy_default=True)
SAMPLING = Sampler(())


def test_probabilities_give_nan_logits_no_mass_and_share_it_among_infinite_ones() -> None:
    nan, inf = float("nan"), float("inf")
    processed = torch.tensor([[0.0, nan, 1.0, -inf], [inf, 2.0, inf, nan]])
    e = torch.e
    expected = torch.tensor([[1 / (1 + e), 0.0, e / (1 + e), 0.0], [0.5, 0.0, 0.5, 0.0]])
    assert torch.allclose(probabilities(processed), expected)
    # verify passes (B, k + 1, V): an infinite logit at one position says nothing about the next one
    rounds = torch.tensor([[[inf, 0.0, 1.0], [0.0, 0.0, 1.0]]])
    expected = torch.tensor([[[1.0, 0.0, 0.0], [1 / (2 + e), 1 / (2 + e), e / (2 + e)]]])
    assert torch.allclose(probabilities(rounds), expected)


def test_a_round_without_drafts_accepts_none_and_draws_from_p_with_the_generator() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 1, 5, generator=g)  # (B, k + 1 = 1, V)
    history = torch.zeros(3, 4, dtype=torch.long)
    accepted, emitted = verify(logits, None, history, 4, sampler=GREEDY, generator=None)
    assert accepted.shape == (3,) and accepted.dtype == torch.long and not accepted.any()
    assert torch.equal(emitted, logits.argmax(dim=-1))

    accepted, emitted = verify(logits, None, history, 4, sampler=SAMPLING, generator=torch.Generator().manual_seed(5))
    assert accepted.shape == (3,) and accepted.dtype == torch.long and not accepted.any()
    # The exponential race: argmax p_i / E_i with E_i ~ Exp(1) from the same generator is a draw from p.
    race = torch.empty(3, 1, 5).exponential_(1.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(emitted, (torch.softmax(logits, dim=-1) / race).argmax(dim=-1))


def test_a_rejected_draft_is_never_replaced_by_a_token_the_drafter_over_proposes() -> None:
    """The replacement is drawn from max(0, p - q): a token with q >= p at every position has no mass there."""
    rows, k, vocab, over = 20_000, 2, 6, 4
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g), dim=-1)
    q = 0.5 * p[:k] + 0.5 * torch.nn.functional.one_hot(torch.tensor(over), vocab)  # q(over) > p(over), q < p elsewhere
    tokens = torch.multinomial(q, rows, replacement=True, generator=g).T.contiguous()  # (rows, k)
    draft = Draft(tokens=tokens, valid=torch.ones_like(tokens, dtype=torch.bool), probs=q.expand(rows, k, vocab))
    accepted, emitted = verify(p.log().expand(rows, k + 1, vocab), draft, torch.zeros(rows, 1 + k, dtype=torch.long), 1,
                               sampler=SAMPLING, generator=g)
    rejected = accepted < k
    assert rejected.sum() > 2_000  # q puts half its mass on `over`: rejections are common
    replacements = emitted[rejected, accepted[rejected]]
    assert not (replacements == over).any()
    assert len(replacements.unique()) == vocab - 1  # every other token does come up


def models():
    return (specformer.build(tiny_with(), seed=0).eval(),
            specformer.build(tiny_with(n_layers=1), seed=1).eval())  # the drafter: a smaller model, same vocabulary


IDS = torch.tensor([[1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [7, 8, 9, 7, 8, 9, 7, 8, 9, 7]])


def test_a_seeded_sampled_run_reads_only_its_own_generator() -> None:
    """The first token, the drafter's proposals and the acceptance draws all come from ``seed``'s generator:
    torch's global random state does not change the result."""
    model, small = models()
    settings = dict(max_new_tokens=8, sampler=[], draft=small, draft_tokens=3)
    runs = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        runs.append(generate(model, IDS, seed=11, **settings))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], generate(model, IDS, seed=12, **settings))  # the draws do matter
    assert_not_degenerate(runs[0][:, IDS.shape[1]:], IDS)


@pytest.mark.parametrize("sampler", [None, []], ids=["greedy", "sampling"])
def test_speculative_decoding_makes_its_tensors_on_the_prompts_device_not_the_default_one(sampler) -> None:
    """Under another default device (meta standing in for an accelerator) a CPU run is unchanged."""
    model, small = models()
    settings = dict(max_new_tokens=8, sampler=sampler, seed=3, draft=small, draft_tokens=3)
    expected = generate(model, IDS, **settings)
    with torch.device("meta"):
        got = generate(model, IDS, **settings)
    assert got.device.type == "cpu" and torch.equal(got, expected)


class Recorder:
    """Collects the token counts generate() reports to plugins."""

    def __init__(self) -> None:
        self.tokens: list[int] = []

    @hookimpl
    def specformer_on_generate_end(self, tokens: int, seconds: float) -> None:
        self.tokens.append(tokens)


@pytest.fixture
def recorder():
    pm = get_plugin_manager()
    rec = Recorder()
    pm.register(rec, name="test-speculative-recorder")
    yield rec
    pm.unregister(rec)


PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [7, 8, 9]]


def test_rounds_of_several_tokens_stop_sample_and_count_like_plain_greedy(recorder) -> None:
    """With a copy of the model as the drafter every draft is accepted, so each round emits k + 1 tokens: an
    eos inside a round, a sampler that reads the history at each position, the stream's columns and the
    token count must all be those of plain greedy decoding (itself checked against transformers)."""
    model, _ = models()
    twin = copy.deepcopy(model)
    sampler = [{"kind": "repetition_penalty", "penalty": 1.5}, "greedy"]
    free = generate(model, PROMPTS, max_new_tokens=12, sampler=sampler)
    new = free[0][len(PROMPTS[0]):]
    assert_not_degenerate([new], [PROMPTS[0]])
    eos = new[6]  # step 6: the second token of a round (step 0 alone, then rounds of k + 1 = 4 from step 1)
    assert eos not in new[:6] and eos not in free[1][len(PROMPTS[1]):]  # ends row 0 there and only row 0
    settings = dict(max_new_tokens=12, sampler=sampler, eos_token_id=eos)
    plain = generate(model, PROMPTS, **settings)
    assert len(plain[0]) == len(PROMPTS[0]) + 7 and len(plain[1]) == len(PROMPTS[1]) + 12
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    assert generate(model, PROMPTS, draft=twin, draft_tokens=3, **settings) == plain
    hook.remove()
    # speculation did run: the prompt, then one forward per round of up to k + 1 = 4 tokens (12 steps: 1 + 3 rounds)
    assert len(calls) == 4
    # Without the penalty on the history, the tokens differ: the check above reads it.
    assert generate(model, PROMPTS, max_new_tokens=12) != free
    padded = torch.tensor([PROMPTS[0], [7, 8, 9] * 3 + [7]])
    assert torch.equal(generate(model, padded, draft=twin, draft_tokens=3, **settings), generate(model, padded, **settings))
    assert list(stream(model, PROMPTS, draft=twin, draft_tokens=3, **settings)) == list(stream(model, PROMPTS, **settings))
    recorder.tokens.clear()
    for draft in (None, twin):
        generate(model, PROMPTS, draft=draft, draft_tokens=3, **settings)
        generate(model, PROMPTS, draft=draft, draft_tokens=3, max_new_tokens=9, sampler=sampler)  # no eos: every step
    assert recorder.tokens == [7 + 12, 2 * 9] * 2
