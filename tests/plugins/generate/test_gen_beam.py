"""Greedy and beam search against Hugging Face transformers on a tiny Llama with copied weights (logits,
greedy, processors, beams), then beam search against a search written out in the test on random
chains: the finishing and stopping rules, stop sequences, padding, the memory limit and the device."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_generate import generate

from .llama_reference import LLAMA_SPEC, hf_llama_from
from .specs_for_tests import TINY, assert_not_degenerate

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


PROMPT = [5, 17, 3, 40]


def ends_at_first_stop(row: list[int], start: int, stop: list[int]) -> bool:
    """Whether ``row`` (generated from ``start`` on) ends right after the first stop sequence it produces."""
    n = len(stop)
    for end in range(max(start, n), len(row) + 1):  # a stop may start in the prompt, but ends on a new token
        if end > start and row[end - n : end] == stop:
            return end == len(row)
    return True  # never produced: nothing to end


def test_beam_search_stops_a_beam_at_a_stop_sequence() -> None:
    model = specformer.build(TINY, seed=0)
    free = generate(model, [PROMPT], max_new_tokens=8, num_beams=2)[0]
    assert_not_degenerate([free[len(PROMPT):]], [PROMPT])
    stop = free[len(PROMPT) + 2 : len(PROMPT) + 4]  # the 3rd and 4th new tokens of the unstopped best beam
    assert not ends_at_first_stop(free, len(PROMPT), stop)  # without the stop, the beam runs on past it
    out = generate(model, [PROMPT], max_new_tokens=8, num_beams=2, stop=[stop])[0]
    assert out[: len(PROMPT)] == PROMPT
    # The winner may be a beam that never produced the stop (a full-length beam can score higher),
    # but no returned beam runs on past one.
    assert ends_at_first_stop(out, len(PROMPT), stop)


def test_beam_settings_are_checked_once_by_generate_with_the_accepted_values() -> None:
    import pytest

    model = specformer.build(TINY)
    with pytest.raises(ValueError, match=r"early_stopping must be True, False or 'never', got str 'sometimes'"):
        generate(model, [[1, 2, 3]], max_new_tokens=2, num_beams=2, early_stopping="sometimes")


# -- beam search against a search written out in the test ------------------------------------------

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from specformer_generate.beam import beam_search  # noqa: E402
from specformer_generate.inputs import prompt_batch  # noqa: E402


class Chain(nn.Module):
    """Next-token log-probabilities depend on the last token and its position: ``table[position, last]``.

    No attention, no cache. The position breaks the ties a plain Markov chain has between
    sequences that take the same transitions in another order."""

    context_length = 16
    d_model = 1  # read by the memory estimate

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.vocab_size = table.shape[-1]
        self.register_buffer("table", table)
        self.unused = nn.Parameter(torch.zeros(1))  # generate() reads the device from a parameter
        self.calls = 0

    def attention_modules(self) -> list[nn.Module]:
        return []

    def forward(self, tokens, *, positions=None, last_only=False, cache=None):
        self.calls += 1
        return self.table[positions.clamp(min=0), tokens]  # (B, T, V)


def random_chain(seed: int, vocab: int = 8, spread: float = 2.0) -> Chain:
    """Log-probabilities of a random chain, rounded to float32 (what the search computes in)."""
    g = torch.Generator().manual_seed(seed)
    return Chain(torch.log_softmax(torch.randn(Chain.context_length, vocab, vocab, generator=g) * spread, dim=-1))


def reference_search(table: torch.Tensor, prompt: list[int], *, max_new_tokens: int, num_beams: int,
                     length_penalty: float, early_stopping, eos: list[int], stop: list[list[int]],
                     repetition_penalty: float | None = None) -> tuple[list[int], int]:
    """Beam search as transformers defines it, one prompt, every (beam, token) candidate considered.

    Each step ranks all continuations of the running beams by summed log-probability; those of
    the best ``num_beams`` that end (eos, stop sequence, last step) enter the finished set
    scored ``sum / generated ** length_penalty``; the best ``num_beams`` that do not end run on.
    The prompt is done when the finished set is full and ``early_stopping`` is True, or the best
    running beam scored at its length (``"never"``: at the longest length) cannot beat the worst
    finished one. The winner is the best finished sequence.
    """
    logp = table.double()
    running: list[tuple[float, list[int]]] = [(0.0, list(prompt))]
    finished: list[tuple[float, list[int]]] = []
    for step in range(max_new_tokens):
        generated = step + 1

        def ends(seq: list[int]) -> bool:
            hit_stop = any(len(seq) >= len(s) and seq[-len(s):] == s for s in stop)
            return seq[-1] in eos or hit_stop or generated == max_new_tokens

        candidates = []
        for score, seq in running:
            row = torch.log_softmax(logp[len(seq) - 1, seq[-1]], dim=-1)
            if repetition_penalty is not None:  # CTRL: a seen token's log-prob (negative) times the penalty
                for token in set(seq):
                    row[token] = row[token] * repetition_penalty
            candidates += [(score + float(row[t]), seq + [t]) for t in range(len(row))]
        candidates.sort(key=lambda c: -c[0])
        full = len(finished) == num_beams
        if not (early_stopping is True and full):
            finished += [(s / generated**length_penalty, seq) for s, seq in candidates[:num_beams] if ends(seq)]
            finished = sorted(finished, key=lambda f: -f[0])[:num_beams]
        running = [c for c in candidates if not ends(c[1])][:num_beams]
        if not running:
            break
        if len(finished) == num_beams:
            if early_stopping is True:
                break
            length = max_new_tokens if (early_stopping == "never" and length_penalty > 0) else generated
            if not running[0][0] / length**length_penalty > finished[-1][0]:
                break
    return finished[0][1], step


CHAIN_CASES = [
    # seed, num_beams, length_penalty, early_stopping, eos, stop, spread of the chain's logits
    (0, 2, 1.0, False, [3], [], 2.0),
    (1, 3, 1.0, False, [2, 5], [], 2.0),
    (2, 2, 2.0, "never", [1], [[4, 6]], 2.0),
    (3, 3, 0.5, True, [0, 7], [[2, 2]], 2.0),
    (4, 2, -0.5, "never", [6], [[1, 3], [5]], 2.0),
    (5, 3, 1.5, False, [4], [[0, 1]], 2.0),
    (6, 2, 1.0, True, [2], [], 2.0),
    (7, 4, 2.0, "never", [5, 6], [], 2.0),
    (8, 2, 1.0, "never", [3], [[7, 1]], 2.0),
    (9, 3, 0.0, False, [1], [[3, 4]], 2.0),
    # Found by planting mutants: "never" scoring the running beam at its longest length (a heuristic stop at
    # the current length loses the winner); one prompt done by the heuristic while the other runs on (no more
    # finished beams for it); more than num_beams of the best candidates ending (two eos ids, a stop);
    # a False search not stopping once the finished set is full.
    (3331, 2, 1.0, "never", [5, 7], [], 2.0),
    (3586, 3, 1.0, "never", [4, 7], [[5, 1]], 1.0),
    (3003, 3, 1.0, "never", [0, 6], [], 2.0),
    (3000, 2, 1.5, False, [4, 1], [[4, 3]], 1.0),
    (3001, 3, 2.0, False, [3, 2], [[5, 7]], 2.0),
    (3444, 2, 2.0, True, [3, 5], [[1, 4]], 1.0),
    (3034, 3, 1.5, False, [5, 1], [], 1.0),
]


def chain_prompts(seed: int) -> list[list[int]]:
    return [[seed % 8], [(seed + 3) % 8, (seed + 5) % 8, seed % 8]]


@pytest.mark.parametrize("seed, num_beams, length_penalty, early_stopping, eos, stop, spread", CHAIN_CASES)
def test_beam_search_finds_the_written_out_searchs_winner(seed, num_beams, length_penalty, early_stopping, eos,
                                                         stop, spread) -> None:
    model = random_chain(seed, spread=spread)
    settings = dict(max_new_tokens=7, num_beams=num_beams, length_penalty=length_penalty,
                    early_stopping=early_stopping)
    out = generate(model, chain_prompts(seed), eos_token_id=eos, stop=stop, use_cache=False, **settings)
    expected = [reference_search(model.table, p, eos=eos, stop=stop, **settings) for p in chain_prompts(seed)]
    assert out == [winner for winner, _ in expected]
    # and it stops as soon as every prompt is done: the prompt's forward, then one per step that did not end it
    assert model.calls == 1 + max(stopped_at for _, stopped_at in expected)


def test_the_chain_cases_tell_the_stopping_rules_apart() -> None:
    """Each other early_stopping rule picks another winner in some case, and some searches stop before
    max_new_tokens: the cases cannot pass with the rules mixed up."""
    def searches(**override) -> list[tuple[list[int], int]]:
        got = []
        for seed, nb, lp, early, eos, stop, spread in CHAIN_CASES:
            settings = dict(max_new_tokens=7, num_beams=nb, length_penalty=lp, early_stopping=early, eos=eos, stop=stop)
            table = random_chain(seed, spread=spread).table
            got += [reference_search(table, p, **{**settings, **override}) for p in chain_prompts(seed)]
        return got

    base = searches()
    for rule in (True, False, "never"):
        assert [w for w, _ in searches(early_stopping=rule)] != [w for w, _ in base], rule
    assert any(stopped_at < 6 for _, stopped_at in base)


def test_beam_search_applies_the_samplers_processors_to_the_whole_history() -> None:
    model = random_chain(11, spread=1.0)
    prompts = [[1, 2, 3], [4]]
    settings = dict(max_new_tokens=6, num_beams=3, length_penalty=1.0, early_stopping=False)
    out = generate(model, prompts, eos_token_id=[0], use_cache=False,
                   sampler=[{"kind": "repetition_penalty", "penalty": 2.0}], **settings)
    expected = [reference_search(model.table, p, eos=[0], stop=[], repetition_penalty=2.0, **settings)[0]
                for p in prompts]
    assert out == expected
    assert expected != [reference_search(model.table, p, eos=[0], stop=[], **settings)[0] for p in prompts]


@pytest.mark.parametrize("seed, pad_token_id, eos, stop, pad",
                         [(12, 7, [2], [], 7), (13, None, [2, 6], [], 2), (12, None, [], [[2]], -1)])
def test_a_tensor_result_pads_shorter_winners_and_counts_the_generated_tokens(seed, pad_token_id, eos, stop,
                                                                             pad) -> None:
    """Rows end at different lengths; the columns after a row's end hold ``pad_token_id``, else the first
    eos id, else -1; the count of generated tokens is the winners' own."""
    model = random_chain(seed, spread=1.0)
    prompts = torch.tensor([[3, 5], [0, 1]])
    settings = dict(max_new_tokens=6, num_beams=2, length_penalty=1.0, early_stopping=False)
    winners = [reference_search(model.table, p, eos=eos, stop=stop, **settings)[0] for p in prompts.tolist()]
    generated = [len(w) - 2 for w in winners]
    assert len(set(generated)) > 1, generated  # the case pads one row
    width = 2 + max(generated)
    expected = torch.tensor([w + [pad] * (width - len(w)) for w in winners])
    batch = prompt_batch(prompts, vocab_size=8, device=torch.device("cpu"))
    out, produced = beam_search(model, batch, eos=eos, stop=stop, pad_token_id=pad_token_id, sampler=None,
                                use_cache=False, compile=False, **settings)
    assert torch.equal(out, expected), (out, expected)
    assert produced == sum(generated)
    assert beam_search(model, prompt_batch(prompts.tolist(), vocab_size=8, device=torch.device("cpu")), eos=eos,
                       stop=stop, pad_token_id=pad_token_id, sampler=None, use_cache=False, compile=False,
                       **settings) == (winners, sum(generated))
    # generate() hands its pad_token_id on to the search
    assert torch.equal(generate(model, prompts, eos_token_id=eos, stop=stop, pad_token_id=pad_token_id,
                                use_cache=False, **settings), expected)


def test_beam_search_keeps_to_the_memory_limit_it_is_given() -> None:
    from specformer.errors import MemoryLimitError

    model = specformer.build(TINY, seed=0)
    with pytest.raises(MemoryLimitError):
        generate(model, [PROMPT], max_new_tokens=8, num_beams=2, max_memory=1024)
    assert len(generate(model, [PROMPT], max_new_tokens=8, num_beams=2, max_memory="unlimited")[0]) == len(PROMPT) + 8


def test_beam_search_makes_its_tensors_on_the_batchs_device_not_the_default_one() -> None:
    """Under another default device (meta standing in for an accelerator) beam search on a CPU model works
    unchanged: every tensor it makes is put on the prompts' device."""
    model = specformer.build(TINY, seed=0).eval()
    settings = dict(max_new_tokens=5, num_beams=3, length_penalty=1.0, early_stopping=False, sampler=None,
                    eos=[4], stop=[[1, 2]], pad_token_id=None, compile=False)
    for prompts in (torch.tensor([[5, 17, 3, 40], [7, 8, 9, 10]]), [[5, 17, 3, 40], [7]]):
        for use_cache in (True, False):
            batch = prompt_batch(prompts, vocab_size=model.vocab_size, device=torch.device("cpu"))
            with torch.no_grad():
                expected = beam_search(model, batch, use_cache=use_cache, **settings)
                with torch.device("meta"):
                    got = beam_search(model, batch, use_cache=use_cache, **settings)
            if isinstance(expected[0], torch.Tensor):
                assert got[0].device.type == "cpu" and torch.equal(got[0], expected[0])
            else:
                assert got[0] == expected[0]
            assert got[1] == expected[1]


@pytest.mark.slow
def test_beam_search_with_a_torch_compile_step_rounds_its_cache_within_the_context() -> None:
    """compile= rounds the cache up to a multiple of 128 tokens within the model's context (one graph per
    bucket); the "eager" backend keeps it quick. The tokens are those of the uncompiled search."""
    model = specformer.build(TINY, seed=0)
    plain = generate(model, [PROMPT], max_new_tokens=4, num_beams=2)
    assert generate(model, [PROMPT], max_new_tokens=4, num_beams=2, compile="eager") == plain


def test_a_running_beam_that_can_only_tie_the_worst_finished_one_stops_the_search() -> None:
    """The early stop is strict, as in transformers: a best running beam whose bound equals the worst
    finished score exactly cannot improve the finished set, so the search ends there.

    Every probability is 1/2 or 1 (float32 computes log 1/2 and its doubling exactly), with
    ``length_penalty=0``: after START the end token and A, after A the end token and X,
    after X the end token only. Two steps finish [END] (-ln 2) and [A, END] (-2 ln 2); the
    running [A, X] is at -2 ln 2 too, so nothing can beat the worst finished beam.
    """
    start, a, x, end, other = range(5)
    rows = torch.full((5, 5), -30.0)
    rows[start, [end, a]] = 0.0
    rows[a, [end, x]] = 0.0
    rows[x, end] = 0.0
    rows[end, end] = 0.0
    rows[other, end] = 0.0
    model = Chain(torch.log_softmax(rows, dim=-1).expand(Chain.context_length, 5, 5).contiguous())
    settings = dict(max_new_tokens=5, num_beams=2, length_penalty=0.0, early_stopping=False)
    out = generate(model, [[start]], eos_token_id=[end], use_cache=False, **settings)
    assert out == [[start, end]]
    assert reference_search(model.table, [start], eos=[end], stop=[], **settings) == ([start, end], 1)
    assert model.calls == 2  # the prompt, then one step: the tie ends it
