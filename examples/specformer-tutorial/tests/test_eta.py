"""Eta sampling: the threshold formula, the tokens always kept, and the spec round trip."""

from __future__ import annotations

import math

import pytest
import specformer
import torch
from specformer_tutorial import EtaSampling


def reference(logits: torch.Tensor, epsilon: float) -> torch.Tensor:
    """The paper's rule, one row at a time in float64."""
    out = logits.clone()
    for row in range(logits.shape[0]):
        p = logits[row].double().softmax(-1)
        entropy = -sum(float(q) * math.log(float(q)) for q in p if q > 0)
        eta = min(epsilon, math.sqrt(epsilon) * math.exp(-entropy))
        for v in range(logits.shape[1]):
            if p[v] < eta and v != int(p.argmax()):
                out[row, v] = float("-inf")
    return out


def test_matches_the_formula():
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * torch.tensor([[0.5], [2.0], [4.0], [8.0]])
    got = EtaSampling(EtaSampling.Params(epsilon=0.02))(logits, torch.zeros(4, 1, dtype=torch.long))
    torch.testing.assert_close(got, reference(logits, 0.02))


def test_keeps_the_likeliest_tokens():
    logits = torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    kept = EtaSampling(EtaSampling.Params(epsilon=0.5, min_tokens_to_keep=2))(logits, torch.zeros(1, 1, dtype=torch.long))
    assert torch.isfinite(kept).sum() == 2


def test_matches_transformers_eta_warper():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    logits = torch.randn(3, 100) * 3
    ours = EtaSampling(EtaSampling.Params(epsilon=0.001))(logits, torch.zeros(3, 1, dtype=torch.long))
    theirs = transformers.EtaLogitsWarper(epsilon=0.001)(torch.zeros(3, 1, dtype=torch.long), logits.clone())
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))


MODEL = {"vocab_size": 64, "d_model": 32, "n_layers": 1, "context_length": 16, "positional": "rope",
         "block": {"norm": "rmsnorm", "mixer": {"kind": "attention", "n_heads": 4}, "ffn": "swiglu"}}


def test_usable_from_a_spec_generate_section():
    spec = {
        "model": MODEL,
        "generate": {"sampler": [{"kind": "eta", "epsilon": 0.0009}, {"kind": "temperature", "value": 0.8}]},
    }
    if "generate" not in specformer.get_registry().sections:
        pytest.skip("the generate plugin (which owns the spec's generate section) is not installed")
    sampler = specformer.load_spec(spec).section("generate").build_sampler()
    assert isinstance(sampler.steps[0], EtaSampling)
    bad = {**spec, "generate": {"sampler": [{"kind": "eta", "epsilon": 2}]}}
    with pytest.raises(specformer.SpecError, match=r"generate\.sampler\[0\]\.epsilon: .*less than 1"):
        specformer.load_spec(bad)


def test_generates_with_eta_sampling():
    generate = pytest.importorskip("specformer_generate", reason="the generate plugin is not installed").generate
    model = specformer.build({"model": MODEL}, seed=0)
    sampler = [{"kind": "eta", "epsilon": 0.0009}]
    first = generate(model, [[1, 2, 3]], max_new_tokens=8, sampler=sampler, seed=0)
    again = generate(model, [[1, 2, 3]], max_new_tokens=8, sampler=sampler, seed=0)
    assert first == again and len(first[0]) == 3 + 8
    assert all(0 <= t < 64 for t in first[0])
