"""Speculative decoding: the same greedy tokens, the same sampling distribution, with batches, stops and windows.

Then ``verify`` driven directly with hand-made distributions (the formula written in the test:
softmax with NaN as no mass, the exponential race for a draw, ``max(0, p - q)`` for a
replacement), and the loop through ``generate`` for what only it shows: a seeded run does not
read torch's global random state, and every tensor lands on the prompts' device.
"""

from __future__ import annotations

import copy

import pytest
import torch

import specformer
from specformer.registry.hookspecs import hookimpl
from specformer.registry.discovery import get_plugin_manager
from specformer_generate import StaticKVCache, generate, stream
from specformer_generate.samplers.pipeline import Sampler
from specformer_generate.speculative import Draft, probabilities, verify

from .specs_for_tests import assert_not_degenerate, tiny_with

WINDOWED = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": 5}
SPECS = {
    "rope": tiny_with(),
    "window": tiny_with(mixer=WINDOWED),
    "learned": tiny_with(positional={"kind": "learned"}),
}
PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [7, 8, 9], [11, 12, 11, 12, 11]]


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest (tests/conftest.py)


def build(data: dict, seed: int = 0):
    return specformer.build(data, seed=seed).eval()


@pytest.fixture(scope="module")
def models():
    return {name: build(data) for name, data in SPECS.items()}


@pytest.fixture(scope="module")
def draft():
    """A smaller model over the same 61-token vocabulary (one layer, half the width)."""
    data = tiny_with(n_layers=1, d_model=16)
    data["model"]["block"]["ffn"]["hidden"] = 32
    return build(data, seed=1)


def count_forwards(model) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("name, k", [("rope", 3), ("window", 1), ("window", 4), ("learned", 3)])
def test_greedy_is_plain_greedy_token_for_token(models, draft, name, k) -> None:
    model = models[name]
    plain = generate(model, PROMPTS, max_new_tokens=24)
    assert_not_degenerate(plain, PROMPTS)
    for drafter in ("ngram", draft):
        assert generate(model, PROMPTS, max_new_tokens=24, draft=drafter, draft_tokens=k) == plain
    for prompt, row in zip(PROMPTS, plain):  # each row alone too
        assert generate(model, [prompt], max_new_tokens=24, draft=draft, draft_tokens=k) == [row]


def test_a_perfect_draft_is_accepted_so_the_model_runs_once_per_round(models) -> None:
    """A draft that always agrees: every round keeps k + 1 tokens, so the model runs n / (k + 1) times.

    This is what makes speculation pay; a loop that rejected everything would still give
    the right tokens, one per forward.
    """
    model = models["window"]  # the window (5) is shorter than a round's rollback span: the ring's spare slots matter
    twin = copy.deepcopy(model)
    plain = generate(model, [PROMPTS[0]], max_new_tokens=41)
    calls = count_forwards(twin)
    target_calls = count_forwards(model := copy.deepcopy(model))
    out = generate(model, [PROMPTS[0]], max_new_tokens=41, draft=twin, draft_tokens=4)
    assert out == plain
    assert target_calls[0] == 1 + 40 // 5  # prefill, then rounds of 5 tokens after the first
    assert calls[0] > 0


def counting_model():
    """A real model whose greedy next token is the last token + 1: blocks add nothing (output projections
    zeroed), and the head row of token j is the embedding of token j - 1."""
    model = build(tiny_with(), seed=2)
    with torch.no_grad():
        for block in model.blocks:
            block.mixer.out.weight.zero_()
            block.ffn.down.weight.zero_()
        model.lm_head.weight.copy_(torch.roll(model.embedding.weight, 1, dims=0))
    return model


def test_prompt_lookup_drafts_what_followed_the_last_occurrence() -> None:
    model = counting_model()
    prompt = list(range(1, 15)) + [1, 2, 3]  # "1 2 3" occurred before, followed by 4 5 6 ...
    plain = generate(model, [prompt], max_new_tokens=9)
    assert plain[0][len(prompt):] == list(range(4, 13))
    calls = count_forwards(model)
    assert generate(model, [prompt], max_new_tokens=9, draft="ngram", draft_tokens=4) == plain
    assert calls[0] == 3  # prefill (token 4), then 5..8 drafted and accepted with 9, then 10..12 with none left over


def test_prompt_lookup_drafts_k_tokens_of_text_in_a_loop() -> None:
    """Text repeating with a period shorter than k: the last occurrence of the tail ends right before it, so
    fewer than k tokens follow it; the drafter copies on over its own drafts (period 2 here), drafts k
    tokens a round, and all of them are accepted. Drafting only what followed would keep 2 of 4."""
    model = counting_model()
    with torch.no_grad():  # the greedy next token becomes the last token xor 1: 6 7 6 7 ...
        partner = (torch.arange(model.lm_head.weight.shape[0]) ^ 1).clamp(max=model.lm_head.weight.shape[0] - 1)
        model.lm_head.weight.copy_(model.embedding.weight[partner])
    prompt = [6, 7, 6, 7]
    plain = generate(model, [prompt], max_new_tokens=21)
    assert plain[0][len(prompt):] == [6, 7] * 10 + [6]
    calls = count_forwards(model)
    assert generate(model, [prompt], max_new_tokens=21, draft="ngram", draft_tokens=4) == plain
    assert calls[0] == 1 + 20 // 5  # prefill (the first token), then four rounds of four drafts and one more


def test_stop_sequences_eos_and_tensor_input(models, draft) -> None:
    model = models["rope"]
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    plain = generate(model, ids, max_new_tokens=30)
    eos, stop = int(plain[0, 10]), plain[1, 8:10].tolist()
    expected = generate(model, ids, max_new_tokens=30, eos_token_id=eos, stop=[stop], pad_token_id=0)
    assert expected.shape[1] < ids.shape[1] + 30  # both rows stopped early
    for drafter in ("ngram", draft):
        got = generate(model, ids, max_new_tokens=30, eos_token_id=eos, stop=[stop], pad_token_id=0,
                       draft=drafter, draft_tokens=3)
        assert torch.equal(got, expected)


def test_stream_yields_the_same_columns(models, draft) -> None:
    model = models["window"]
    plain = list(stream(model, PROMPTS, max_new_tokens=25))
    assert list(stream(model, PROMPTS, max_new_tokens=25, draft=draft, draft_tokens=3)) == plain


def test_rollback_of_a_ring_cache_keeps_what_the_window_needs(models) -> None:
    """Write 4 drafted columns into a window-5 ring, drop 3: the next logits equal a cache that never saw them."""
    model = models["window"]
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]])
    positions = torch.arange(12)[None]
    clean = StaticKVCache.for_model(model, batch_size=1, capacity=20)
    model(ids[:, :9], positions=positions[:, :9], cache=clean)
    expected = model(ids[:, 9:10], positions=positions[:, 9:10], cache=clean)
    rolled = StaticKVCache.for_model(model, batch_size=1, capacity=20, spare=3)
    model(ids[:, :9], positions=positions[:, :9], cache=rolled)
    model(torch.tensor([[40, 41, 42, 43]]), positions=torch.arange(9, 13)[None], cache=rolled)
    rolled.rollback(10)  # keep the first of the four (column 9), as if one draft was accepted
    rolled.rollback(9)
    assert torch.allclose(model(ids[:, 9:10], positions=positions[:, 9:10], cache=rolled), expected, atol=1e-5)
    tight = StaticKVCache.for_model(model, batch_size=1, capacity=20, spare=1)
    model(ids[:, :9], positions=positions[:, :9], cache=tight)
    model(ids[:, 9:12], positions=positions[:, 9:12], cache=tight)
    with pytest.raises(ValueError, match="spare"):
        tight.rollback(9)


# -- sampling keeps the model's distribution ----------------------------------------------

V, K, ROWS = 6, 3, 200_000


def _tv(samples: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(samples, minlength=probs.numel()).double()
    return 0.5 * float((counts / counts.sum() - probs.double()).abs().sum())


def _distributions():
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(K + 1, V, generator=g) * 1.5, dim=-1)  # the model, one position after another
    q = torch.softmax(torch.randn(K, V, generator=g) * 1.5, dim=-1)  # the drafter
    return p, q


def _round(p: torch.Tensor, q: torch.Tensor | None, rule=verify, seed: int = 0):
    """One speculative round on ROWS rows whose model ignores context (p per position), drafts drawn from q."""
    g = torch.Generator().manual_seed(seed)
    if q is None:  # a point-mass drafter proposing the model's likeliest token (as prompt lookup often does)
        tokens = p[:K].argmax(dim=-1).expand(ROWS, K).contiguous()
        draft = Draft(tokens=tokens, valid=torch.ones_like(tokens, dtype=torch.bool))
    else:
        tokens = torch.multinomial(q, ROWS, replacement=True, generator=g).T.contiguous()  # (ROWS, K)
        draft = Draft(tokens=tokens, valid=torch.ones_like(tokens, dtype=torch.bool), probs=q.expand(ROWS, K, V))
    logits = p.log().expand(ROWS, K + 1, V)
    history = torch.zeros((ROWS, 1 + K), dtype=torch.long)
    return rule(logits, draft, history, 1, sampler=Sampler(()), generator=g)


def _worst_tv(p, accepted, emitted) -> float:
    """Largest TV distance between the tokens emitted at a position (in rows that reach it) and p there."""
    return max(_tv(emitted[accepted >= j, j], p[j]) for j in range(K + 1))


#: With 200k rows (at least ~8k reach the last position here) sampling noise stays below 0.02.
TV_BOUND = 0.02


@pytest.mark.parametrize("point_mass", [False, True])
def test_every_emitted_token_has_the_models_distribution(point_mass) -> None:
    p, q = _distributions()
    accepted, emitted = _round(p, None if point_mass else q)
    assert (accepted == K).sum() > 3_000 and (accepted == 0).sum() > 3_000  # every branch is exercised
    assert _worst_tv(p, accepted, emitted) < TV_BOUND


def _accept_below_p(logits, draft, history, filled, *, sampler, generator):
    """A wrong rule: accept with probability p(d) (ignoring q), replace from p."""
    p = torch.softmax(logits, dim=-1)
    pd = p[:, :-1].gather(-1, draft.tokens[..., None])[..., 0]
    ok = torch.rand(pd.shape, generator=generator) < pd
    accepted = ok.long().cumprod(1).sum(1)
    replacement = torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=generator).view(p.shape[:2])
    drafted = torch.cat((draft.tokens, replacement[:, -1:]), 1)
    j = torch.arange(p.shape[1])
    return accepted, torch.where(j < accepted[:, None], drafted, replacement)


def _replace_from_p(logits, draft, history, filled, *, sampler, generator):
    """A wrong rule: the right acceptance, but the replacement drawn from p instead of max(0, p - q)."""
    accepted, emitted = verify(logits, draft, history, filled, sampler=sampler, generator=generator)
    p = torch.softmax(logits, dim=-1)
    fresh = torch.multinomial(p.reshape(-1, p.shape[-1]), 1, generator=generator).view(p.shape[:2])
    j = torch.arange(p.shape[1])
    return accepted, torch.where(j < accepted[:, None], emitted, fresh)


@pytest.mark.parametrize("rule", [_accept_below_p, _replace_from_p])
def test_the_bound_catches_a_wrong_acceptance_rule(rule) -> None:
    p, q = _distributions()
    assert _worst_tv(p, *_round(p, q, rule=rule)) > 3 * TV_BOUND


@pytest.mark.slow
def test_sampled_generation_matches_the_models_distribution_end_to_end() -> None:
    """Two sampled tokens after a prompt, 3000 seeded runs each way, against the exact joint distribution."""
    data = tiny_with(vocab_size=5, d_model=16, init_std=0.6)
    model, small = build(data, seed=4), build(tiny_with(vocab_size=5, d_model=16, n_layers=1, init_std=0.6), seed=5)
    prompt = [1, 2, 3]
    with torch.no_grad():  # the exact joint of (x1, x2): p(x1) p(x2 | x1)
        first = torch.softmax(model(torch.tensor([prompt]))[0, -1], -1)
        seconds = torch.softmax(model(torch.tensor([prompt + [t] for t in range(5)]))[:, -1], -1)
        joint = (first[:, None] * seconds).flatten()
    draws = 3000
    for drafter in (small, "ngram"):
        pairs = torch.tensor([
            (lambda row: row[3] * 5 + row[4])(generate(model, [prompt], max_new_tokens=2, sampler=[], seed=s,
                                                       draft=drafter, draft_tokens=2)[0])
            for s in range(draws)
        ])
        # 25 outcomes, 3000 draws: sampling noise gives TV about 0.04; a draft's own distribution is 0.2+ away.
        assert _tv(pairs, joint) < 0.07, drafter


# -- bad input -----------------------------------------------------------------------------


def test_bad_drafts_are_clear_errors(models) -> None:
    model = models["rope"]
    other_vocab = build(tiny_with(vocab_size=60))
    with pytest.raises(ValueError, match="vocabulary has 60 tokens but the model's has 61"):
        generate(model, PROMPTS, max_new_tokens=4, draft=other_vocab)
    with pytest.raises(ValueError, match="'ngram'"):
        generate(model, PROMPTS, max_new_tokens=4, draft="bigram")
    with pytest.raises(ValueError, match="draft_tokens must be an integer >= 1"):
        generate(model, PROMPTS, max_new_tokens=4, draft="ngram", draft_tokens=0)
    with pytest.raises(ValueError, match="use_cache=True"):
        generate(model, PROMPTS, max_new_tokens=4, draft="ngram", use_cache=False)
    with pytest.raises(ValueError, match="beam search"):
        generate(model, PROMPTS, max_new_tokens=4, draft="ngram", num_beams=2)
    short = build(tiny_with(context_length=16))
    with pytest.raises(ValueError, match="context length"):
        generate(model, PROMPTS, max_new_tokens=20, draft=short)


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


def model_and_drafter():
    return (specformer.build(tiny_with(), seed=0).eval(),
            specformer.build(tiny_with(n_layers=1), seed=1).eval())  # the drafter: a smaller model, same vocabulary


IDS = torch.tensor([[1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [7, 8, 9, 7, 8, 9, 7, 8, 9, 7]])


def test_a_seeded_sampled_run_reads_only_its_own_generator() -> None:
    """The first token, the drafter's proposals and the acceptance draws all come from ``seed``'s generator:
    torch's global random state does not change the result."""
    model, small = model_and_drafter()
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
    model, small = model_and_drafter()
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


TWO_PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [7, 8, 9]]


def test_rounds_of_several_tokens_stop_sample_and_count_like_plain_greedy(recorder) -> None:
    """With a copy of the model as the drafter every draft is accepted, so each round emits k + 1 tokens: an
    eos inside a round, a sampler that reads the history at each position, the stream's columns and the
    token count must all be those of plain greedy decoding (itself checked against transformers)."""
    model, _ = model_and_drafter()
    twin = copy.deepcopy(model)
    sampler = [{"kind": "repetition_penalty", "penalty": 1.5}, "greedy"]
    free = generate(model, TWO_PROMPTS, max_new_tokens=12, sampler=sampler)
    new = free[0][len(TWO_PROMPTS[0]):]
    assert_not_degenerate([new], [TWO_PROMPTS[0]])
    eos = new[6]  # step 6: the second token of a round (step 0 alone, then rounds of k + 1 = 4 from step 1)
    assert eos not in new[:6] and eos not in free[1][len(TWO_PROMPTS[1]):]  # ends row 0 there and only row 0
    settings = dict(max_new_tokens=12, sampler=sampler, eos_token_id=eos)
    plain = generate(model, TWO_PROMPTS, **settings)
    assert len(plain[0]) == len(TWO_PROMPTS[0]) + 7 and len(plain[1]) == len(TWO_PROMPTS[1]) + 12
    calls = []
    hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
    assert generate(model, TWO_PROMPTS, draft=twin, draft_tokens=3, **settings) == plain
    hook.remove()
    # speculation did run: the prompt, then one forward per round of up to k + 1 = 4 tokens (12 steps: 1 + 3 rounds)
    assert len(calls) == 4
    # Without the penalty on the history, the tokens differ: the check above reads it.
    assert generate(model, TWO_PROMPTS, max_new_tokens=12) != free
    padded = torch.tensor([TWO_PROMPTS[0], [7, 8, 9] * 3 + [7]])
    assert torch.equal(generate(model, padded, draft=twin, draft_tokens=3, **settings), generate(model, padded, **settings))
    assert list(stream(model, TWO_PROMPTS, draft=twin, draft_tokens=3, **settings)) == list(stream(model, TWO_PROMPTS, **settings))
    recorder.tokens.clear()
    for draft in (None, twin):
        generate(model, TWO_PROMPTS, draft=draft, draft_tokens=3, **settings)
        generate(model, TWO_PROMPTS, draft=draft, draft_tokens=3, max_new_tokens=9, sampler=sampler)  # no eos: every step
    assert recorder.tokens == [7 + 12, 2 * 9] * 2
