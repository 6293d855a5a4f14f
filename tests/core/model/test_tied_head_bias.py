"""model.lm_head_bias with tied embeddings: the head shares the embedding table, its bias is a parameter of its own
(CTRL's lm_head.bias beside its tied weight)."""

from __future__ import annotations

import torch

import specformer
from specformer.model.summary import summarize
from specformer.spec.check import check_spec

from fixtures.tiny import tiny_spec


def _tied(**model):
    return tiny_spec(**{"vocab_size": 50, "tie_embeddings": True, "lm_head_bias": True, **model})


def test_the_logits_are_the_final_stream_times_the_embedding_plus_the_bias():
    model = specformer.build(_tied(), seed=0)
    with torch.no_grad():
        model.head_bias.bias.uniform_(-1, 1)
    ids = torch.arange(12).reshape(1, 12)
    seen = {}
    model.final_norm.register_forward_hook(lambda _m, _i, out: seen.setdefault("h", out))
    with torch.no_grad():
        logits = model(ids)
        # logits = final_norm(h) E^T + b, with E the embedding table the head shares
        expected = seen["h"] @ model.embedding.weight.T + model.head_bias.bias
        torch.testing.assert_close(logits, expected, rtol=1e-6, atol=1e-6)
    assert model.tie_embeddings and model.lm_head is None


def test_the_bias_starts_at_zero_and_is_counted_once_with_the_head():
    plain = specformer.build(_tied(lm_head_bias=False), seed=0)
    model = specformer.build(_tied(), seed=0)
    model.init_weights()
    assert torch.count_nonzero(model.head_bias.bias) == 0
    assert model.num_parameters() == plain.num_parameters() + 50
    summary = summarize(_tied())
    assert summary.params["lm_head"] == 50
    assert summary.total == model.num_parameters()
    checked = check_spec(_tied(pad_vocab_to_multiple=64))
    assert checked.sizes.parameters == checked.shape.parameters


def test_the_bias_is_saved_and_loaded(tmp_path):
    model = specformer.build(_tied(), seed=0)
    with torch.no_grad():
        model.head_bias.bias.fill_(0.5)
    specformer.save(model, tmp_path / "ckpt")
    loaded = specformer.load(tmp_path / "ckpt")
    assert torch.equal(loaded.head_bias.bias, model.head_bias.bias)
    ids = torch.arange(8).reshape(1, 8)
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_the_bias_gets_a_gradient():
    model = specformer.build(_tied(), seed=0)
    model(torch.arange(8).reshape(1, 8)).sum().backward()
    assert model.head_bias.bias.grad is not None and torch.count_nonzero(model.head_bias.bias.grad) > 0
