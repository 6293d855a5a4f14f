"""torch.compile(fullgraph=True) works on built models: the registry leaves nothing dynamic behind."""

from __future__ import annotations

import pytest
import torch

import specformer

from conftest import SPECS


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny.yaml", "tiny-gpt2.yaml", "tiny-alternating.json"])
def test_compiled_model_matches_eager_forward_and_backward(name):
    torch._dynamo.reset()
    model = specformer.build(SPECS / name, seed=0)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randint(0, model.vocab_size, (2, 16))
    eager = model(x)
    out = compiled(x)
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())
