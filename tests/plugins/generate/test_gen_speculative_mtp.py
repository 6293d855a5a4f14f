"""``draft="mtp"``: self-speculative decoding with the model's own multi-token prediction depths.

The drafts are checked against the depths' logits computed independently (``model(..., with_mtp=True)``
over the whole text, no window, no cache); the output against plain greedy decoding token for token;
the sampled distribution against the exact joint; and a model without depths is refused.
"""

from __future__ import annotations

import copy

import pytest
import torch

import specformer
from specformer_generate import generate
from specformer_generate.drafters import MTPDrafter
from specformer_generate.inputs import prompt_batch
from specformer_generate.samplers.pipeline import Sampler

from .specs_for_tests import assert_not_degenerate, tiny_with
from .test_gen_speculative import PROMPTS, _tv

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest (tests/conftest.py)

GREEDY = Sampler((), greedy_default=True)


def mtp_model(depths: int, seed: int = 0, **changes):
    return specformer.build(tiny_with(mtp={"depths": depths}, **changes), seed=seed).eval()


@pytest.fixture(scope="module")
def models():
    return {1: mtp_model(1), 2: mtp_model(2, seed=3)}  # seeds whose greedy continuations vary


def _drafts(model, text: list[int], k: int, *, window: int = 1000) -> list[int]:
    """What the drafter proposes after ``text`` (batch of one), its hidden states from one forward without cache."""
    ids = torch.tensor([text])
    with torch.no_grad():
        _, hidden = model(ids, return_hidden=True)
        drafter = MTPDrafter(model, window=window)
        drafter.start(prompt_batch(ids, vocab_size=61, device=torch.device("cpu")), capacity=len(text) + k, spare=k)
        drafter.read_hidden(hidden[:, :-1], 0)  # the columns the model has read: all but the last token
        tokens = torch.cat((ids, torch.zeros((1, k), dtype=torch.long)), dim=1)
        draft = drafter.propose(tokens, tokens.clone(), len(text), k, offsets=torch.zeros((1, 1), dtype=torch.long),
                                sampler=GREEDY, generator=None)
    assert bool(draft.valid.all())
    return draft.tokens[0].tolist()


@pytest.mark.parametrize("depths, k", [(2, 1), (2, 2), (1, 3), (2, 4)])
def test_drafts_are_the_depths_argmax_depths_in_order_then_the_last_one_chained(models, depths, k) -> None:
    """Draft m is the argmax of depth min(m, D) at the last row of the text followed by drafts 1..m-1.

    The reference runs ``with_mtp`` over the whole extended text on a copy of the model whose
    depth list is the model's depths followed by its last depth repeated (the chaining), so row i
    of depth m reads h^{m-1} and the token m ahead exactly as the paper's equations say.
    """
    model = models[depths]
    chained = copy.deepcopy(model)
    chained.mtp = torch.nn.ModuleList([*model.mtp, *[model.mtp[-1]] * max(0, k - depths)])
    text = [5, 17, 3, 40, 22, 9, 31, 8]
    drafts = _drafts(model, text, k)
    last = len(text) - 2  # the row whose token ahead (the last one of the text) is known
    expected = []
    with torch.no_grad():
        for m in range(1, k + 1):
            sequence = torch.tensor([text + expected])  # (1, T + m - 1)
            _, mtp = chained(sequence, with_mtp=True)
            expected.append(int(mtp[m - 1][0, last].argmax()))
    assert drafts == expected
    # A window shorter than the text gives other depth outputs (the attention sees less), still valid tokens.
    assert len(_drafts(model, text, k, window=2)) == k


@pytest.mark.parametrize("depths, k", [(1, 1), (1, 4), (2, 2), (2, 5)])
def test_greedy_with_mtp_drafts_is_plain_greedy_token_for_token(models, depths, k) -> None:
    model = models[depths]
    plain = generate(model, PROMPTS, max_new_tokens=24)
    assert_not_degenerate(plain, PROMPTS)
    assert generate(model, PROMPTS, max_new_tokens=24, draft="mtp", draft_tokens=k) == plain  # a left-padded batch
    for prompt, row in zip(PROMPTS, plain):  # each row alone too
        assert generate(model, [prompt], max_new_tokens=24, draft="mtp", draft_tokens=k) == [row]


def test_a_windowed_depth_and_a_sliding_window_model_still_give_plain_greedy() -> None:
    model = mtp_model(2, mixer={"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": 5})
    plain = generate(model, PROMPTS, max_new_tokens=30)
    assert generate(model, PROMPTS, max_new_tokens=30, draft="mtp", draft_tokens=3) == plain


@pytest.mark.slow
def test_sampled_generation_with_mtp_drafts_matches_the_models_distribution() -> None:
    """Two sampled tokens after a prompt, 3000 seeded runs, against the exact joint distribution."""
    model = mtp_model(2, seed=4, vocab_size=5, d_model=16, init_std=0.6)
    prompt = [1, 2, 3]
    with torch.no_grad():  # the exact joint of (x1, x2): p(x1) p(x2 | x1)
        first = torch.softmax(model(torch.tensor([prompt]))[0, -1], -1)
        seconds = torch.softmax(model(torch.tensor([prompt + [t] for t in range(5)]))[:, -1], -1)
        joint = (first[:, None] * seconds).flatten()
    pairs = torch.tensor([
        (lambda row: row[3] * 5 + row[4])(generate(model, [prompt], max_new_tokens=3, sampler=[], seed=s,
                                                   draft="mtp", draft_tokens=2)[0])
        for s in range(3000)
    ])
    # 25 outcomes, 3000 draws: sampling noise gives TV about 0.04; the depths' own distribution is far off.
    assert _tv(pairs, joint) < 0.07


def test_a_model_without_mtp_depths_is_refused_naming_what_is_accepted() -> None:
    plain = specformer.build(tiny_with(), seed=0).eval()
    with pytest.raises(ValueError, match=r"this model \(Decoder, 2 layers\) has none; use 'ngram' \(prompt lookup\) or a smaller draft model"):
        generate(plain, PROMPTS, max_new_tokens=4, draft="mtp")
