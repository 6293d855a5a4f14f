"""Left-padded batches on every attention backend: padded rows stay finite, real rows are unchanged.

Padding queries (position -1) must not be fully masked: a softmax over no key is NaN,
and a NaN in a padded row can reach real rows through a later reduction (or through
the cache). Each backend is run with and without the KV cache, and every real row is
compared with the same prompt run alone, unpadded.
"""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_generate import StaticKVCache

from .specs_for_tests import tiny_with

ATTENTION = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}
BACKENDS = {
    "sdpa": dict(mixer=ATTENTION),
    "eager": dict(mixer={**ATTENTION, "backend": "eager"}),
    "softcap": dict(mixer={**ATTENTION, "logit_softcap": 5.0}),
    "softcap-sdpa-request": dict(mixer={**ATTENTION, "logit_softcap": 5.0, "backend": "sdpa"}),
    "window-eager": dict(mixer={**ATTENTION, "backend": "eager", "window": 3}),
    "window-sdpa": dict(mixer={**ATTENTION, "window": 3}),
    "alibi-sdpa": dict(mixer=ATTENTION, positional={"kind": "alibi"}),
    "alibi-eager": dict(mixer={**ATTENTION, "backend": "eager"}, positional={"kind": "alibi"}),
}
PROMPTS = [[5, 9, 2, 7, 1, 3, 8], [4, 4, 1], [7]]


def padded(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    tokens = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    positions = torch.tensor([[-1] * (width - len(p)) + list(range(len(p))) for p in prompts])
    return tokens, positions


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def model(request) -> torch.nn.Module:
    return specformer.build(tiny_with(**BACKENDS[request.param]), seed=0).double().eval()


@pytest.mark.parametrize("use_cache", [False, True])
def test_padded_rows_are_finite_and_real_rows_equal_the_prompt_alone(model, use_cache: bool) -> None:
    tokens, positions = padded(PROMPTS)
    with torch.no_grad():
        if use_cache:
            cache = StaticKVCache.for_model(model, batch_size=len(PROMPTS), capacity=tokens.shape[1] + 1)
            logits = model(tokens, positions=positions, cache=cache)
            # one more token per row through the cache: the padded slots are read again
            step = model(torch.tensor([[1]] * len(PROMPTS)), positions=positions[:, -1:] + 1, cache=cache)
        else:
            logits = model(tokens, positions=positions)
    assert torch.isfinite(logits).all(), "padding rows gave non-finite logits"
    width = tokens.shape[1]
    for row, prompt in enumerate(PROMPTS):
        with torch.no_grad():
            alone = model(torch.tensor([prompt]))[0]
            alone_next = model(torch.tensor([prompt + [1]]))[0, -1]
        torch.testing.assert_close(logits[row, width - len(prompt):], alone, rtol=0, atol=1e-10)
        if use_cache:
            assert torch.isfinite(step).all()
            torch.testing.assert_close(step[row, -1], alone_next, rtol=0, atol=1e-10)


def test_the_core_mask_lets_padding_queries_see_every_key() -> None:
    """What keeps padded rows finite on every backend: a padding query (position < 0) is never fully masked."""
    from specformer_layers.attention import causal_mask

    q = torch.tensor([[-1, -1, 0, 1]])
    k = torch.tensor([[-1, -1, 0, 1]])
    for window in (None, 1):
        mask = causal_mask(q, k, window=window)[0, 0]  # (Tq, Tk)
        assert mask[:2].all()
        expected_real = [[False, False, True, False], [False, False, window is None, True]]
        assert mask[2:].tolist() == expected_real


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_eager_attention_gives_zeros_not_nan_for_a_query_with_no_key(monkeypatch, softcap) -> None:
    """Even with a mask that leaves a query nothing (a third-party cache or mask), eager stays finite."""
    from specformer.model.context import ForwardContext
    from specformer_layers.attention import kernels
    from specformer_layers.attention.causal import CausalSelfAttention

    torch.manual_seed(0)
    params = CausalSelfAttention.Params(n_heads=2, backend="eager", logit_softcap=softcap)
    attention = CausalSelfAttention(params, d_model=16).double()
    x = torch.randn(1, 3, 16, dtype=torch.double)

    def no_key_for_the_first_query(ctx, k_positions, rule):
        mask = real_mask(ctx, k_positions, rule).clone()
        mask[:, :, 0] = False  # (B, 1, Tq, Tk): query 0 sees nothing
        return mask

    real_mask = kernels.attention_mask
    monkeypatch.setattr(kernels, "attention_mask", no_key_for_the_first_query)
    positional = specformer.build(tiny_with(), seed=0).positional
    ctx = ForwardContext(positions=torch.arange(3)[None], positional=positional,
                         positional_state=positional.prepare(torch.arange(3)[None]) if hasattr(positional, "prepare") else None)
    y = attention(x, ctx)
    assert torch.isfinite(y).all()
    # zero attention output for query 0 leaves only the output projection's bias (none here)
    torch.testing.assert_close(y[0, 0], torch.zeros(16, dtype=torch.double), rtol=0, atol=0)
