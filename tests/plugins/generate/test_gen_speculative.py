"""Speculative decoding: the same greedy tokens, the same sampling distribution, with batches, stops and windows."""

from __future__ import annotations

import copy

import pytest
import torch

import specformer
from specformer_generate import StaticKVCache, generate, stream
from specformer_generate.speculative import Draft, verify
from specformer_generate.samplers.pipeline import Sampler

from .specs_for_tests import assert_not_degenerate, tiny_with

WINDOWED = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": 5}
SPECS = {
    "rope": tiny_with(),
    "window": tiny_with(attention=WINDOWED),
    "learned": tiny_with(positional={"kind": "learned"}),
}
PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [7, 8, 9], [11, 12, 11, 12, 11]]


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


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one thread is fastest, and far faster on a loaded machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


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
            block.attention.out.weight.zero_()
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
