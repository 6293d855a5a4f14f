"""generate() and stream(): batching with left padding, stopping, seeds, hooks, errors, compile.

The second half pins generate()/stream()'s bookkeeping and the plain decode loop with fake models
where only an attribute's absence matters, with a scripted sampler (it emits chosen tokens and
records the logits it is given) where the tokens must be known in advance, and with spies on the
functions generate hands its arguments to. The cached loop is checked against ``use_cache=False``
(the whole sequence recomputed every step), an independent path.
"""

from __future__ import annotations

import importlib
import inspect
import time
from typing import Any
import warnings

import pytest
import torch

import specformer
from specformer.errors import MemoryLimitError
from specformer_generate import generate, stream
from specformer_generate.decode import cache_capacity, step_function
from specformer_generate.inputs import prompt_batch
from specformer_generate.arguments import check_mode
from specformer_generate.memory import estimate, format_bytes
from specformer_generate.samplers.pipeline import Sampler

from .specs_for_tests import assert_not_degenerate, tiny_with

PROMPTS = [[3, 14, 15, 9, 2, 6, 5, 3, 5], [8, 9], [7, 9, 3, 2, 3], [1]]


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    data = tiny_with()
    data["model"]["layers"] = [{"select": 1, "mixer": {"window": 6}}]
    return specformer.build(data, seed=0).double().eval()


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding written out: a full forward per token, argmax of the last logits."""
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    return ids


def test_greedy_matches_the_written_out_loop(model) -> None:
    for prompt in PROMPTS:
        out = generate(model, [prompt], max_new_tokens=15)
        assert out == [greedy_reference(model, prompt, 15)]
        assert_not_degenerate(out, [prompt])


@pytest.mark.parametrize("use_cache", [True, False])
def test_each_padded_row_gives_what_it_gives_alone(model, use_cache: bool) -> None:
    batched = generate(model, PROMPTS, max_new_tokens=15, use_cache=use_cache)
    alone = [generate(model, [p], max_new_tokens=15, use_cache=use_cache)[0] for p in PROMPTS]
    assert batched == alone
    assert_not_degenerate(batched, PROMPTS)


def test_padded_rows_match_alone_with_history_samplers(model) -> None:
    sampler = [{"kind": "repetition_penalty", "penalty": 1.8}, {"kind": "no_repeat_ngram", "n": 2},
               {"kind": "frequency_penalty", "penalty": 0.5}, "greedy"]
    batched = generate(model, PROMPTS, max_new_tokens=15, sampler=sampler)
    alone = [generate(model, [p], max_new_tokens=15, sampler=sampler)[0] for p in PROMPTS]
    assert batched == alone
    for row in batched:  # the n-gram ban actually held
        pairs = list(zip(row, row[1:]))
        assert len(pairs) == len(set(pairs))


def test_tensor_in_tensor_out(model) -> None:
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]])
    out = generate(model, ids, max_new_tokens=7)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 9 + 7)
    assert torch.equal(out[:, :9], ids)
    assert out.tolist() == generate(model, ids.tolist(), max_new_tokens=7)


def test_eos_ends_each_row_and_is_kept(model) -> None:
    free = generate(model, PROMPTS, max_new_tokens=12)
    eos = free[0][len(PROMPTS[0]) + 3]  # a token row 0 produces at its 4th step
    out = generate(model, PROMPTS, max_new_tokens=12, eos_token_id=eos)
    for prompt, row, unstopped in zip(PROMPTS, out, free):
        new = unstopped[len(prompt):]
        end = new.index(eos) + 1 if eos in new else len(new)
        assert row == prompt + new[:end]
    assert len(out[0]) <= len(PROMPTS[0]) + 4  # the eos chosen ends row 0 by its 4th token


def test_eos_in_a_tensor_result_pads_after_the_end(model) -> None:
    ids = torch.tensor([PROMPTS[0], PROMPTS[0][::-1]])
    free = generate(model, ids, max_new_tokens=10)[:, 9:].tolist()
    # An eos that row 0 produces early and row 1 never does.
    eos = next(t for t in free[0] if t not in free[1])
    k = free[0].index(eos) + 1  # row 0's new tokens, eos included
    out = generate(model, ids, max_new_tokens=10, eos_token_id=[eos, 10_000], pad_token_id=-5)
    assert out.shape == (2, 19)
    assert out[0, 9:].tolist() == free[0][:k] + [-5] * (10 - k)
    assert out[1, 9:].tolist() == free[1]
    alone = generate(model, ids[:1], max_new_tokens=10, eos_token_id=eos, pad_token_id=-5)
    assert alone.shape == (1, 9 + k)  # trimmed once every row ended


def test_stop_sequences_end_a_row(model) -> None:
    free = generate(model, [PROMPTS[2]], max_new_tokens=12)[0]
    new = free[len(PROMPTS[2]):]
    stop = new[4:6]
    out = generate(model, [PROMPTS[2]], max_new_tokens=12, stop=[[10_000, 3], stop])[0]
    # A stop sequence may start in the prompt; it must end on a generated token.
    end = next(j for j in range(len(PROMPTS[2]), len(free)) if free[j - 1 : j + 1] == stop)
    assert out == free[: end + 1]
    assert len(out) < len(free)


def test_the_result_does_not_depend_on_how_often_the_host_looks(model) -> None:
    free = generate(model, PROMPTS, max_new_tokens=20)
    eos = free[1][len(PROMPTS[1]) + 2]
    results = [generate(model, PROMPTS, max_new_tokens=20, eos_token_id=eos, check_every=k) for k in (1, 3, 64)]
    assert results[0] == results[1] == results[2]


def test_seeded_sampling_is_repeatable_and_seeds_differ(model) -> None:
    sampler = [{"kind": "top_k", "k": 20}, {"kind": "temperature", "value": 1.5}]
    a = generate(model, PROMPTS, max_new_tokens=20, sampler=sampler, seed=1)
    b = generate(model, PROMPTS, max_new_tokens=20, sampler=sampler, seed=1)
    c = generate(model, PROMPTS, max_new_tokens=20, sampler=sampler, seed=2)
    assert a == b
    assert a != c


def test_sampling_with_cache_equals_sampling_without(model) -> None:
    sampler = [{"kind": "min_p", "p": 0.05}, {"kind": "temperature", "value": 0.9}]
    a = generate(model, PROMPTS, max_new_tokens=20, sampler=sampler, seed=5)
    b = generate(model, PROMPTS, max_new_tokens=20, sampler=sampler, seed=5, use_cache=False)
    assert a == b


def test_stream_yields_the_tokens_generate_returns(model) -> None:
    free = generate(model, PROMPTS, max_new_tokens=10)
    eos = free[0][len(PROMPTS[0]) + 1]
    expected = generate(model, PROMPTS, max_new_tokens=10, eos_token_id=eos, pad_token_id=-1)
    columns = list(stream(model, PROMPTS, max_new_tokens=10, eos_token_id=eos, pad_token_id=-1))
    for row, (prompt, full) in enumerate(zip(PROMPTS, expected)):
        streamed = [c[row] for c in columns if c[row] != -1]
        assert prompt + streamed == full


def test_stream_ends_once_every_row_finished(model) -> None:
    free = generate(model, [PROMPTS[0]], max_new_tokens=10)[0]
    new = free[len(PROMPTS[0]):]
    eos = new[2]
    assert len(list(stream(model, [PROMPTS[0]], max_new_tokens=10, eos_token_id=eos))) == new.index(eos) + 1


def _modes(model) -> list[bool]:
    return [m.training for m in model.modules()]


def test_generation_never_switches_the_models_mode(model) -> None:
    """A model left in training mode (no dropout) is run as it is: no eval()/train() toggling."""
    expected = generate(model, PROMPTS, max_new_tokens=5)
    seen: list[list[bool]] = []
    handle = model.register_forward_pre_hook(lambda module, args: seen.append(_modes(module)))
    model.train()
    try:
        assert generate(model, PROMPTS, max_new_tokens=5) == expected
        assert [c for c in stream(model, PROMPTS, max_new_tokens=3)]
        generate(model, PROMPTS[:2], max_new_tokens=3, num_beams=2)
        assert seen and all(all(modes) for modes in seen)  # training mode during every forward
        assert all(_modes(model))
    finally:
        handle.remove()
        model.eval()
    generate(model, PROMPTS, max_new_tokens=3)
    assert not any(_modes(model))


def test_concurrent_calls_on_a_model_in_training_mode_neither_race_nor_change_it(model) -> None:
    import threading

    sampler = [{"kind": "top_k", "k": 5}]
    expected = [generate(model, PROMPTS, max_new_tokens=6, sampler=sampler, seed=s) for s in range(4)]
    model.train()
    results: dict[int, list] = {}
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for _ in range(3):
                out = generate(model, PROMPTS, max_new_tokens=6, sampler=sampler, seed=seed)
                streamed = list(stream(model, PROMPTS[:1], max_new_tokens=2, sampler=sampler, seed=seed))
                assert len(streamed) == 2
                results.setdefault(seed, []).append(out)
        except BaseException as exc:  # reported in the main thread
            errors.append(exc)

    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert all(_modes(model))  # still in training mode, every module
    finally:
        model.eval()
    for seed in range(4):
        assert results[seed] == [expected[seed]] * 3


def test_a_model_in_training_mode_with_dropout_is_refused_not_switched() -> None:
    data = tiny_with(mixer={"kind": "attention", "n_heads": 4, "dropout": 0.1})
    m = specformer.build(data, seed=0)
    assert m.training
    for call in (lambda: generate(m, [[1, 2]], max_new_tokens=2), lambda: list(stream(m, [[1, 2]], max_new_tokens=2))):
        with pytest.raises(ValueError, match=r"training mode and blocks\.0\.mixer applies dropout \(0\.1\).*"
                                             r"call model\.eval\(\)"):
            call()
        assert all(_modes(m))
    m.eval()
    assert len(generate(m, [[1, 2]], max_new_tokens=2)[0]) == 4
    assert not any(_modes(m))


@pytest.mark.parametrize(
    "prompts, kwargs, match",
    [
        ([[1, 2]], {"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
        # Past the context: a rope model warns and goes on; refusals are in test_past_context.py.
        ([[1, 2], []], {"max_new_tokens": 3}, r"input_ids\[1\] is an empty prompt"),
        ([], {"max_new_tokens": 3}, "non-empty list"),
        ([1, 2, 3], {"max_new_tokens": 3}, "wrap a single prompt"),
        ([[1, 99]], {"max_new_tokens": 3}, r"token id 99 is outside the model's vocabulary \[0, 61\)"),
        ([[1, -2]], {"max_new_tokens": 3}, "token id -2"),
        (torch.tensor([1, 2]), {"max_new_tokens": 3}, "use input_ids\\[None\\]"),
        (torch.zeros(1, 2), {"max_new_tokens": 3}, "integer token ids"),
        ([[1, 2]], {"max_new_tokens": 3, "num_beams": 0}, "num_beams must be an integer >= 1"),
        ([[1, 2]], {"max_new_tokens": 3, "num_beams": 2, "early_stopping": "sometimes"}, "early_stopping"),
        ([[1, 2]], {"max_new_tokens": 3, "stop": [[]]}, "stop\\[0\\] is an empty sequence"),
        # wrong types: one clear message each, never a raw TypeError
        ([[1, 2]], {"max_new_tokens": 3, "eos_token_id": "</s>"}, "eos_token_id must be a token id.*encode text"),
        ([[1, 2]], {"max_new_tokens": 3, "eos_token_id": [3, "x"]}, "eos_token_id must be a token id"),
        ([[1, 2]], {"max_new_tokens": 3, "eos_token_id": -4}, "eos_token_id must hold token ids >= 0"),
        ([[1, 2]], {"max_new_tokens": 3, "eos_token_id": True}, "eos_token_id must be a token id"),
        ([[1, 2]], {"max_new_tokens": 3, "pad_token_id": "<pad>"}, "pad_token_id must be an int"),
        ([[1, 2]], {"max_new_tokens": 3, "stop": "\\n"}, "stop must be a list of token-id lists"),
        ([[1, 2]], {"max_new_tokens": 3, "stop": ["ab"]}, r"stop\[0\] must be a list of token ids"),
        ([[1, 2]], {"max_new_tokens": 3, "stop": [5]}, r"stop\[0\] must be a list of token ids"),
        ([[1, 2]], {"max_new_tokens": 3, "seed": "1"}, "seed must be an int"),
        ([[1, 2]], {"max_new_tokens": "3"}, "max_new_tokens must be an integer >= 1"),
        ([[1, 2]], {"max_new_tokens": 3, "num_beams": 2.0}, "num_beams must be an integer >= 1"),
        ([[1, 2]], {"max_new_tokens": 3, "check_every": 0}, "check_every must be an integer >= 1"),
        ([[1, 2]], {"max_new_tokens": 3, "length_penalty": "1"}, "length_penalty must be a finite number"),
        ([[1, 2]], {"max_new_tokens": 3, "use_cache": "yes"}, "use_cache must be True or False"),
        ([[1, 2]], {"max_new_tokens": 3, "compile": 1}, "compile must be True, False or a"),
        ([[1, 2]], {"max_new_tokens": 3, "sampler": 5}, "expected a list of sampler components"),
        ([[1, 2]], {"max_new_tokens": 3, "sampler": "greedy"}, "expected a list of sampler components"),
        ("hello", {"max_new_tokens": 3}, "non-empty list of token lists"),
    ],
)
def test_bad_arguments_are_clear_value_errors(model, prompts, kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        generate(model, prompts, **kwargs)
    if "num_beams" not in kwargs and "length_penalty" not in kwargs and "check_every" not in kwargs:
        with pytest.raises(ValueError, match=match):
            list(stream(model, prompts, **kwargs))


def test_an_eos_id_past_the_vocabulary_is_allowed(model) -> None:
    assert generate(model, [[1, 2]], max_new_tokens=3, eos_token_id=[10_000]) == generate(model, [[1, 2]], max_new_tokens=3)


# -- memory: sizes are computed before anything is allocated ------------------------------


def test_a_million_beams_are_refused_before_allocating(model) -> None:
    from specformer.errors import MemoryLimitError

    with pytest.raises(MemoryLimitError) as info:
        generate(model, [[1, 2]], max_new_tokens=20, num_beams=100_000_000)
    message = str(info.value)
    assert "beam search with 100000000 beams needs about" in message and "GiB" in message
    assert "--max-memory" in message and "SPECFORMER_MAX_MEMORY" in message


def test_the_limit_comes_from_the_argument_then_the_environment(model, monkeypatch) -> None:
    from specformer.errors import MemoryLimitError

    with pytest.raises(MemoryLimitError, match=r"more than the limit of 1\.0 KiB \(max_memory=1KiB\)"):
        generate(model, PROMPTS, max_new_tokens=5, max_memory="1KiB")
    monkeypatch.setenv("SPECFORMER_MAX_MEMORY", "2KiB")
    with pytest.raises(MemoryLimitError, match=r"limit of 2\.0 KiB \(SPECFORMER_MAX_MEMORY=2KiB\)"):
        list(stream(model, PROMPTS, max_new_tokens=5))
    assert generate(model, PROMPTS, max_new_tokens=5, max_memory="1GiB") == generate(
        model, PROMPTS, max_new_tokens=5, max_memory=10**9) == generate(model, PROMPTS, max_new_tokens=5,
                                                                        max_memory="unlimited")
    monkeypatch.setenv("SPECFORMER_MAX_MEMORY", "a lot")
    with pytest.raises(ValueError, match="SPECFORMER_MAX_MEMORY='a lot' is not a size"):
        generate(model, PROMPTS, max_new_tokens=5)


def test_the_cache_estimate_is_what_the_cache_allocates(model) -> None:
    """The arithmetic estimate against the bytes a real cache holds (one layer here is a ring)."""
    from specformer_generate import StaticKVCache
    from specformer_generate.memory import estimate

    for rows, width, new in ((1, 5, 3), (4, 9, 20), (3, 2, 60)):
        cache = StaticKVCache.for_model(model, batch_size=rows, capacity=width + new)
        assert estimate(model, rows=rows, width=width, new_tokens=new).cache == cache.nbytes
    assert estimate(model, rows=4, width=9, new_tokens=20, use_cache=False).cache == 0


def test_beam_search_counts_one_layers_copy_of_the_cache_beside_it(model) -> None:
    """KVCache.reorder copies a layer's keys and values while the old ones are still held: the estimate counts
    the largest layer once more when there are beam candidates."""
    from specformer_generate import StaticKVCache
    from specformer_generate.memory import estimate

    cache = StaticKVCache.for_model(model, batch_size=6, capacity=30)
    largest = max(layer.keys.nbytes + layer.values.nbytes for layer in cache._layers.values())
    beams = estimate(model, rows=6, width=10, new_tokens=20, candidates=12).cache
    assert beams - estimate(model, rows=6, width=10, new_tokens=20).cache == largest


@pytest.mark.parametrize("value", ["", "-1GiB", "0", "8 parsecs", True, "1.2.3G", 0, 2.5])
def test_bad_max_memory_values_are_refused(model, value) -> None:
    with pytest.raises(ValueError, match="max_memory must be a size such as 8GiB"):
        generate(model, PROMPTS, max_new_tokens=2, max_memory=value)



@pytest.mark.mutation_exempt("mutmut's trampolines change what dynamo traces and guards: it recompiles on unmutated code")
def test_compiled_step_gives_the_same_tokens_without_recompiling(model) -> None:
    """The one-token step compiles once; 100 steps of decoding never recompile.

    The ``eager`` backend keeps this fast: recompilation is decided by dynamo's guards,
    the same whatever backend runs the graph (the inductor run is the slow test below).
    """
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()  # they count every graph this process compiled; reset() leaves them
    prompts = [[1, 2, 3], [4, 5]]
    expected = generate(model, prompts, max_new_tokens=60, use_cache=False)
    torch._dynamo.config.error_on_recompile = True
    try:
        first = generate(model, prompts, max_new_tokens=60, compile="eager")
        # Same batch and width; the cache is rounded up to 64 slots either way: the graph is reused.
        second = generate(model, [[6, 7, 8], [9, 1]], max_new_tokens=40, compile="eager")
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert first == expected
    assert len(second[0]) == 43
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
def test_inductor_compiled_step_does_not_recompile_across_100_steps() -> None:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    m = specformer.build(tiny_with(context_length=128), seed=0).eval()
    prompts = [[1, 2, 3, 4], [5, 6]]
    expected = generate(m, prompts, max_new_tokens=100)
    torch._dynamo.config.error_on_recompile = True
    try:
        out = generate(m, prompts, max_new_tokens=100, compile=True)
    finally:
        torch._dynamo.config.error_on_recompile = False
    assert counters["stats"]["unique_graphs"] == 1
    # float32 kernels may differ in the last bits; the first tokens are far from any tie.
    assert [row[:20] for row in out] == [row[:20] for row in expected]


GEN = importlib.import_module("specformer_generate.generation")  # the module (the package exports the function)
BEAM = importlib.import_module("specformer_generate.beam")


class Scripted(Sampler):
    """Emits ``script[step]`` (one id per row) whatever the logits say; records the logits it is given."""

    def __init__(self, script: list[list[int]]) -> None:
        super().__init__((), greedy_default=True)
        self.script = script
        self.logits: list[torch.Tensor] = []

    def sample(self, logits: torch.Tensor, input_ids: torch.Tensor, generator: Any = None) -> torch.Tensor:
        self.logits.append(logits.clone())
        return torch.tensor(self.script[len(self.logits) - 1], device=logits.device)


def tiny(**changes: Any) -> Any:
    return specformer.build(tiny_with(**changes), seed=0).eval()


def forwards(model: torch.nn.Module) -> list[int]:
    """A list that grows by one per call of the model (prefill, step or recompute)."""
    calls: list[int] = []
    model.register_forward_hook(lambda module, args, output: calls.append(1))
    return calls


# -- the context budget -------------------------------------------------------------------------------


class Scheme:
    """Stands for a positional scheme: only its class name shows in messages."""


class Bounded:
    """A model that says nothing about going past its context (no ``past_context``): that is refused."""

    context_length = 8


class Verdict(Bounded):
    def __init__(self, verdict: str) -> None:
        self.verdict = verdict

    def past_context(self) -> tuple[str, Scheme]:
        return self.verdict, Scheme()


def batch_of(*lengths: int) -> Any:
    return prompt_batch([[1] * n for n in lengths], vocab_size=10, device=torch.device("cpu"))


def test_prompt_plus_new_tokens_may_fill_the_context_exactly() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GEN._check_budget(Verdict("no"), batch_of(5, 2), 3) == 3


def test_a_model_without_past_context_is_refused_with_the_numbers_and_no_scheme() -> None:
    with pytest.raises(ValueError) as caught:
        GEN._check_budget(Bounded(), batch_of(5, 2), 4)
    assert str(caught.value) == ("the longest prompt (5 tokens) plus max_new_tokens (4) is 9 tokens, more than the "
                                 "model's context length of 8; use max_new_tokens=3 or less, or shorten the prompt")
    with pytest.raises(ValueError) as caught:
        GEN._check_budget(Bounded(), batch_of(8), 1)
    assert str(caught.value) == ("the longest prompt is 8 tokens, but the model's context length is 8 tokens and at "
                                 "least one must be left for a new token; shorten the prompt to at most 7 tokens "
                                 "(for example keep its last 7)")
    with pytest.raises(ValueError, match=r"is 9 tokens, more than the model's context length of 8 \(its Scheme has no "
                                         r"position past it\); use max_new_tokens=3 or less"):
        GEN._check_budget(Verdict("no"), batch_of(5), 4)


def test_the_past_context_warning_counts_the_tokens_once_per_model() -> None:
    model = Verdict("warn")
    with pytest.warns(UserWarning) as caught:
        assert GEN._check_budget(model, batch_of(5, 3), 7) == 7
    assert str(caught[0].message) == ("generating 12 tokens, past the model's context length of 8: its positions "
                                      "(Scheme) were never trained there, so quality may drop")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        GEN._check_budget(model, batch_of(5), 7)
    assert GEN._check_budget(Verdict("yes"), batch_of(5), 70) == 70


@pytest.mark.parametrize("call", ["greedy", "beam", "stream"])
@pytest.mark.mutation_exempt("mutmut's trampolines put frames of its own files between ours, so the warning moves")
def test_the_past_context_warning_points_at_the_callers_line(call: str) -> None:
    model = tiny(context_length=8)  # plain rope: verdict "warn"
    prompt = torch.tensor([[1, 2, 3, 4, 5]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if call == "greedy":
            generate(model, prompt, max_new_tokens=6)
        elif call == "beam":
            generate(model, prompt, max_new_tokens=6, num_beams=2)
        else:
            list(stream(model, prompt, max_new_tokens=6))
    [warning] = [w for w in caught if "past the model's context length" in str(w.message)]
    assert warning.filename == __file__


# -- train mode and cache restarts --------------------------------------------------------------------


def test_one_submodule_left_in_training_mode_with_dropout_is_refused() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.3)).eval()
    check_mode(model)
    model[1].train()  # torch's own Dropout: its rate is .p
    with pytest.raises(ValueError, match=r"^the model is in training mode and 1 applies dropout \(0.3\), which would"):
        check_mode(model)
    with pytest.raises(ValueError, match=r"^the model is in training mode and the model applies dropout \(0.2\), "):
        check_mode(torch.nn.Dropout(0.2))


class Restarts:
    def __init__(self, *at: int) -> None:
        self.at = set(at)

    def cache_restarts(self) -> set[int]:
        return self.at


def test_a_restart_is_refused_from_the_prompt_width_to_the_last_token_fed_back() -> None:
    batch = batch_of(5, 2)  # width 5; 4 new tokens write columns 5..8, and the model reads up to column 7
    GEN._check_no_restart(object(), batch, 4, use_cache=True, what="beam search")  # no cache_restarts: nothing to cross
    for restart in (4, 8):
        GEN._check_no_restart(Restarts(restart), batch, 4, use_cache=True, what="beam search")
    GEN._check_no_restart(Restarts(5), batch, 4, use_cache=False, what="beam search")
    for restart in (5, 7):
        with pytest.raises(ValueError) as caught:
            GEN._check_no_restart(Restarts(restart, 9), batch, 4, use_cache=True, what="beam search")
        assert str(caught.value) == (
            f"beam search would pass {restart} tokens, where this model's positions switch (longrope reencode) and "
            f"the cached keys must be encoded again, which only greedy decoding and sampling do; use num_beams=1 "
            f"and no draft, use_cache=False, or at most {restart - 4} new tokens")


# -- the decode loop ----------------------------------------------------------------------------------


def test_compile_true_asks_for_a_compiled_step_and_its_rounded_cache(monkeypatch) -> None:
    asked, capacities = [], []
    monkeypatch.setattr(GEN, "step_function", lambda compile: (asked.append(compile), step_function(False))[1])
    for_model = GEN.StaticKVCache.for_model
    monkeypatch.setattr(GEN.StaticKVCache, "for_model", classmethod(
        lambda cls, model, **kw: (capacities.append(kw["capacity"]), for_model(model, **kw))[1]))
    model = tiny()
    prompt = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    out = generate(model, prompt, max_new_tokens=4, compile=True)
    assert asked == [True]
    assert capacities == [cache_capacity(9, context_length=model.context_length, compile=True)] == [64]
    assert torch.equal(out, generate(model, prompt, max_new_tokens=4, use_cache=False))


def test_the_loop_runs_the_model_once_per_token_it_still_needs() -> None:
    model = tiny()
    calls = forwards(model)
    generate(model, torch.tensor([[1, 2, 3]]), max_new_tokens=5)
    assert len(calls) == 5  # the prefill and 4 steps: the last token is never fed back


class Wrapped(torch.nn.Module):
    """A decoder behind a wrapper with only what generate needs: no ``cache_restarts``, no ``past_context``."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner
        self.vocab_size, self.context_length, self.d_model = inner.vocab_size, inner.context_length, inner.d_model

    def attention_modules(self) -> list[torch.nn.Module]:
        return self.inner.attention_modules()

    def forward(self, tokens: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        return self.inner(tokens, **kwargs)


def test_a_model_without_cache_restarts_decodes_through_the_cache() -> None:
    model = Wrapped(tiny())
    assert not hasattr(model, "cache_restarts")
    cached = generate(model, [[1, 2], [3]], max_new_tokens=6)
    assert cached == generate(model, [[1, 2], [3]], max_new_tokens=6, use_cache=False)
    assert cached == generate(model.inner, [[1, 2], [3]], max_new_tokens=6)


def longrope_model() -> Any:
    pairs = 4  # head_dim 8
    scaling = {"kind": "longrope", "short_factor": [1.0 + i / 4 for i in range(pairs)],
               "long_factor": [3.0 + 2 * i for i in range(pairs)], "original_context_length": 8, "reencode": True}
    return specformer.build(tiny_with(context_length=16, positional={"kind": "rope", "scaling": scaling}),
                            seed=0).double().eval()


@pytest.mark.parametrize("pad", [-1, 64])  # below the vocabulary and past it (61 tokens)
def test_the_restart_encodes_tokens_0_and_v_minus_1_and_skips_a_finished_rows_pad(pad: int) -> None:
    model = longrope_model()
    assert model.cache_restarts() == {8} and model.vocab_size == 61
    # Width 5: the restart comes after step 3 (column 8). Row 0 emits the ids 0 and 60 before it;
    # row 1 ends at step 1 on eos 9, so the history holds its pad where the restart reads.
    script = [[0, 60], [60, 9], [0, 33], [5, 44], [12, 3], [60, 0], [1, 2], [3, 4]]
    prompts = [[11, 12, 13, 14, 15], [16, 17, 18]]
    runs = {}
    for use_cache in (True, False):
        sampler = Scripted(script)
        out = generate(model, prompts, max_new_tokens=8, sampler=sampler, eos_token_id=9, pad_token_id=pad,
                       use_cache=use_cache)
        assert out == [prompts[0] + [row[0] for row in script], prompts[1] + [60, 9]]
        runs[use_cache] = sampler.logits
    for step, (cached, recomputed) in enumerate(zip(runs[True], runs[False])):
        running = slice(0, 2) if step < 2 else slice(0, 1)
        assert torch.allclose(cached[running], recomputed[running], atol=1e-5), step


# -- arguments, memory and the pad ---------------------------------------------------------------------


def spy(monkeypatch, module: Any, name: str) -> list[dict[str, Any]]:
    """Record the keyword arguments of every call of ``module.name``, which still runs."""
    calls: list[dict[str, Any]] = []
    real = getattr(module, name)

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return calls


@pytest.mark.parametrize("beams, eos, stop, use_cache, what", [
    (1, None, None, True, "generating for 2 prompt(s)"),
    (1, [1], None, False, "generating for 2 prompt(s)"),
    (2, None, None, True, "beam search with 2 beams"),
    (3, [1, 2], [[3, 4]], True, "beam search with 3 beams"),
    (3, [1, 2], [[3, 4]], False, "beam search with 3 beams"),
])
def test_the_memory_check_counts_rows_and_beam_candidates(monkeypatch, beams, eos, stop, use_cache, what) -> None:
    model = tiny()
    estimates = spy(monkeypatch, GEN, "estimate")
    with pytest.raises(MemoryLimitError) as caught:
        generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=4, num_beams=beams, eos_token_id=eos, stop=stop,
                 use_cache=use_cache, max_memory=1)
    n_eos, n_stop = len(eos or []), len(stop or [])
    candidates = 0 if beams == 1 else 2 * min(max(2, 1 + n_eos + n_stop) * beams, beams * model.vocab_size)
    expected = dict(rows=2 * beams, width=3, new_tokens=4, candidates=candidates, use_cache=use_cache)
    assert estimates == [expected]
    need = estimate(model, **expected)
    assert str(caught.value).startswith(f"{what} needs about {format_bytes(need.total)} (KV cache "
                                        f"{format_bytes(need.cache)}, logits {format_bytes(need.logits)}, ")


def test_a_tensor_result_pads_a_finished_row_with_the_first_eos_id_by_default() -> None:
    out = generate(tiny(), torch.tensor([[1, 2], [3, 4]]), max_new_tokens=4, eos_token_id=[9, 8],
                   sampler=Scripted([[9, 5], [6, 6], [7, 7], [5, 8]]))
    assert out.tolist() == [[1, 2, 9, 9, 9, 9], [3, 4, 5, 6, 7, 8]]


def test_draft_tokens_is_checked_by_name_and_the_drafter_gets_the_call(monkeypatch) -> None:
    model = tiny()
    with pytest.raises(ValueError, match=r"^draft_tokens must be an integer >= 1, got int 0$"):
        generate(model, [[1, 2, 3]], max_new_tokens=4, draft="ngram", draft_tokens=0)
    drafters = spy(monkeypatch, GEN, "speculation_drafter")
    generate(model, [[1, 2, 3], [4]], max_new_tokens=4, draft="ngram")
    [call] = drafters
    assert call["compile"] is False and call["use_cache"] is True and call["needed"] == 3 + 4


def test_the_public_defaults() -> None:
    defaults = {name: p.default for name, p in inspect.signature(generate).parameters.items()}
    assert defaults["length_penalty"] == 1.0 and defaults["early_stopping"] is False  # as in transformers
    assert defaults["check_every"] == 16 and defaults["draft_tokens"] == 4
    assert inspect.signature(stream).parameters["draft_tokens"].default == 4


def test_generate_and_stream_take_the_options_declared_once() -> None:
    from specformer_generate.options import GenerationOptions

    def keywords(function: Any) -> dict[str, Any]:
        return {name: p.default for name, p in inspect.signature(function).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY}

    declared = {f.name: GenerationOptions.__dataclass_fields__[f.name].default
                for f in GenerationOptions.taken(beams=True)}
    assert list(keywords(generate).items()) == [
        (name, inspect.Parameter.empty if name == "max_new_tokens" else default) for name, default in declared.items()]
    beams_only = ["num_beams", "length_penalty", "early_stopping", "check_every"]
    assert list(keywords(stream)) == [name for name in declared if name not in beams_only]
    for function in (generate, stream):  # each option's description is in both docstrings, from the one field
        assert all(f"``{name}``" in function.__doc__ for name in keywords(function))
    with pytest.raises(TypeError, match=r"^stream\(\) got an unexpected keyword argument 'num_beams'$"):
        stream(tiny(), [[1, 2]], max_new_tokens=2, num_beams=2)
    with pytest.raises(TypeError, match=r"^generate\(\) got an unexpected keyword argument 'max_tokens'$"):
        generate(tiny(), [[1, 2]], max_new_tokens=2, max_tokens=2)


def test_the_options_reach_the_loop_as_one_frozen_object(monkeypatch) -> None:
    import dataclasses
    from specformer_generate.options import GenerationOptions

    seen: list[Any] = []
    real = GEN._start

    def recording(model: Any, input_ids: Any, options: Any) -> Any:
        seen.append(options)
        return real(model, input_ids, options)

    monkeypatch.setattr(GEN, "_start", recording)
    assert len(list(stream(tiny(), [[1, 2]], max_new_tokens=3, seed=5, use_cache=False))) == 3
    assert seen == [GenerationOptions(max_new_tokens=3, seed=5, use_cache=False)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[0].seed = 6  # type: ignore[misc]


def test_beam_search_refuses_a_draft_and_checks_seed_and_pad() -> None:
    model = tiny()
    with pytest.raises(ValueError) as caught:
        generate(model, [[1, 2]], max_new_tokens=2, num_beams=2, draft="ngram")
    assert str(caught.value) == ("draft= (speculative decoding) works with sampling and greedy decoding, not beam "
                                 "search; drop num_beams or draft")
    with pytest.raises(ValueError, match="^seed must be an int or None"):
        generate(model, [[1, 2]], max_new_tokens=2, num_beams=2, seed="1")
    with pytest.raises(ValueError, match="^pad_token_id must be an int"):
        generate(model, [[1, 2]], max_new_tokens=2, num_beams=2, pad_token_id="0")


@pytest.mark.parametrize("use_cache", [True, False])
def test_beam_search_gets_the_callers_settings(monkeypatch, use_cache: bool) -> None:
    model = tiny()
    calls = spy(monkeypatch, BEAM, "beam_search")
    generate(model, [[1, 2]], max_new_tokens=2, num_beams=2, use_cache=use_cache)
    sampled = Sampler(())
    generate(model, [[1, 2]], max_new_tokens=2, num_beams=2, use_cache=use_cache, sampler=sampled, seed=0)
    assert [c["sampler"] for c in calls] == [None, sampled]  # None: beam search's own greedy scoring
    assert all(c["use_cache"] is use_cache and c["compile"] is False for c in calls)


@pytest.mark.parametrize("call", ["greedy", "beam", "stream"])
def test_the_end_hook_gets_every_rows_tokens_and_the_wall_time(recorder, call: str) -> None:
    model = tiny()
    prompts = [[1, 2], [3]]
    begin = time.perf_counter()
    if call == "greedy":
        generate(model, prompts, max_new_tokens=3)
    elif call == "beam":
        generate(model, prompts, max_new_tokens=3, num_beams=2)
    else:
        list(stream(model, prompts, max_new_tokens=3))
    wall = time.perf_counter() - begin
    [(tokens, seconds)] = recorder.calls
    assert tokens == 3 * 2 and 0 < seconds <= wall


def test_stream_counts_the_token_a_row_ends_on(recorder) -> None:
    script = [[5, 5], [9, 6], [7, 7], [8, 8]]  # row 0 ends on its second token
    items = list(stream(tiny(), [[1, 2], [3]], max_new_tokens=4, eos_token_id=9, sampler=Scripted(script)))
    assert items == [[5, 5], [9, 6], [9, 7], [9, 8]]
    generate(tiny(), [[1, 2], [3]], max_new_tokens=4, eos_token_id=9, sampler=Scripted(script))
    assert [tokens for tokens, _ in recorder.calls] == [2 + 4, 2 + 4]


@pytest.mark.parametrize("check_every, expected", [(4, 1 + 3), (1, 1 + 2), (3, 1 + 2), (16, 1 + 15)])
def test_the_loop_stops_at_the_first_check_after_every_row_ended(check_every: int, expected: int) -> None:
    model = tiny()
    calls = forwards(model)
    script = [[3, 4], [5, 6], [9, 9]] + [[7, 7]] * 37  # every row ends on its third token
    out = generate(model, torch.tensor([[1, 2], [3, 4]]), max_new_tokens=40, eos_token_id=9,
                   sampler=Scripted(script), check_every=check_every)
    assert isinstance(out, torch.Tensor) and out.tolist() == [[1, 2, 3, 5, 9], [3, 4, 4, 6, 9]]
    assert len(calls) == expected  # the prefill, then one step per token until the check that sees it


def test_stream_passes_max_memory_and_the_draft_on(monkeypatch) -> None:
    model = tiny()
    with pytest.raises(MemoryLimitError, match=r"^generating for 1 prompt\(s\) needs about"):
        next(stream(model, [[1, 2]], max_new_tokens=3, max_memory=1))
    rounds, real = [], GEN.speculative_decode  # called positionally: (run, drafter, draft_tokens)
    monkeypatch.setattr(GEN, "speculative_decode", lambda *args: (rounds.append(args[2]), real(*args))[1])
    items = list(stream(model, [[1, 2, 1, 2, 1]], max_new_tokens=4, draft="ngram", draft_tokens=2))
    assert rounds == [2] and len(items) == 4


def test_every_tensor_the_loop_makes_is_on_the_prompts_device() -> None:
    """With meta as torch's default device, a tensor made without ``device=`` holds no value (see docs/testing)."""
    model, prompt = tiny(), torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    restarting, prompts = longrope_model(), [[11, 12, 13, 14, 15], [16, 17, 18]]
    calls = [
        (model, prompt, {}), (model, prompt, {"use_cache": False}), (model, prompt, {"sampler": [], "seed": 3}),
        (restarting, prompts, {"max_new_tokens": 8}),  # through the LongRoPE restart at column 8
    ]
    expected = [generate(m, p, **{"max_new_tokens": 4, **kw}) for m, p, kw in calls]
    with torch.device("meta"):
        for (m, p, kw), want in zip(calls, expected):
            got = generate(m, p, **{"max_new_tokens": 4, **kw})
            assert (torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want), kw
