"""model.logit_scale: the final logits multiplied by a constant (Cohere), before any soft-cap."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.errors import SpecError

from fixtures.tiny import tiny_spec


def _with(**model):
    return tiny_spec(**{"vocab_size": 50, "n_layers": 1, "context_length": 16,
                        "block": {"mixer": {"kind": "attention", "n_heads": 2}}, **model})


def test_logits_are_the_unscaled_ones_times_the_scale_then_capped():
    ids = torch.arange(12).reshape(1, 12)
    plain = specformer.build(_with(), seed=0)
    scaled = specformer.build(_with(logit_scale=0.0625), seed=0)
    capped = specformer.build(_with(logit_scale=4.0, logit_softcap=3.0), seed=0)
    with torch.no_grad():
        reference = plain(ids)
        assert torch.allclose(scaled(ids), reference * 0.0625, atol=1e-6)
        assert torch.allclose(capped(ids), 3.0 * torch.tanh(reference * 4.0 / 3.0), atol=1e-6)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan")])
def test_a_scale_that_is_not_a_positive_number_is_refused(bad):
    with pytest.raises(SpecError, match="logit_scale"):
        specformer.load_spec(_with(logit_scale=bad))
