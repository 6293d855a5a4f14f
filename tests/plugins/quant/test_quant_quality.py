"""Quantization on a trained model: held-out perplexity within 1% (int8) and 5% (int4, group 32) of float32.

A byte-level model is trained for a few hundred steps on tiny Shakespeare in the test
(a random model's weights have no structure, so its perplexity says nothing); the last
tenth of the text is held out. Greedy continuations of int8 and fp32 are compared too,
and the share of agreeing tokens is printed (``-s``) and bounded.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import specformer
from specformer_generate import generate
from specformer_quant import quantize

from fixtures.tiny import tiny_spec

TEXT = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "tinyshakespeare.txt"
CONTEXT = 64

pytestmark = pytest.mark.skipif(not TEXT.is_file(), reason="needs shared/data/tinyshakespeare.txt")


def spec() -> dict:
    return tiny_spec(vocab_size=256, d_model=128, context_length=CONTEXT, tie_embeddings=False,
                     block={"ffn": {"kind": "swiglu", "hidden": 256}})


@pytest.fixture(scope="module")
def trained():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    data = torch.tensor(list(TEXT.read_bytes()), dtype=torch.long)
    split = int(0.9 * len(data))
    train, held_out = data[:split], data[split:]
    torch.manual_seed(0)
    model = specformer.build(spec(), seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(300):
        starts = torch.randint(0, len(train) - CONTEXT - 1, (16,))
        batch = torch.stack([train[s : s + CONTEXT + 1] for s in starts])  # (16, C + 1)
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    yield model, held_out[: 64 * (CONTEXT + 1)].view(64, CONTEXT + 1)
    torch.set_num_threads(before)


def perplexity(model, windows: torch.Tensor) -> float:
    with torch.no_grad():
        loss = F.cross_entropy(model(windows[:, :-1]).flatten(0, 1), windows[:, 1:].flatten())
    return math.exp(float(loss))


@pytest.mark.slow
def test_quantized_perplexity_stays_within_bounds(trained) -> None:
    model, held_out = trained
    fp32 = perplexity(model, held_out)
    assert fp32 < 12  # it learned something (a uniform byte model is 256)
    results = {}
    # "int8 float head": the LM head kept float32 (quantize_lm_head=False), the default before issue 51
    for scheme, bound in (("int8", 0.01), ("int8 float head", 0.01), ("int4", 0.05), ("bf16", 0.01)):
        quantized = copy.deepcopy(model)
        quantize(quantized, {"kind": "int4", "group_size": 32} if scheme == "int4" else scheme.split()[0],
                 quantize_lm_head=False if scheme == "int8 float head" else None)
        ppl = perplexity(quantized, held_out)
        with torch.no_grad():
            assert not torch.equal(quantized(held_out[:2, :-1]), model(held_out[:2, :-1]))  # it was quantized
        results[scheme] = ppl
        assert abs(ppl / fp32 - 1) < bound, f"{scheme}: perplexity {ppl:.3f} vs fp32 {fp32:.3f}"
    print(f"held-out perplexity fp32 {fp32:.4f}; " + ", ".join(f"{k} {v:.4f} ({v / fp32 - 1:+.3%})"
                                                             for k, v in results.items()))

    quantized = copy.deepcopy(model)
    quantize(quantized, "int8")
    prompts = [held_out[i, :16].tolist() for i in range(8)]
    reference = generate(model, prompts, max_new_tokens=32)
    got = generate(quantized, prompts, max_new_tokens=32)
    same = sum(a == b for r, g in zip(reference, got) for a, b in zip(r[16:], g[16:]))
    share = same / (8 * 32)
    print(f"int8 greedy agreement with fp32: {share:.1%} of 256 tokens")
    assert share > 0.5
