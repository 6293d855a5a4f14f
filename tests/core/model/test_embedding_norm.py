"""model.embedding_norm: a norm on the token embeddings before the first block (BLOOM, nanochat)."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.model.summary import summarize
from specformer.spec.check import check_spec

from fixtures.tiny import tiny_spec


def _with(**model):
    # No mixer and no feed-forward: each block passes the stream through, so the logits are the formula below.
    return tiny_spec(**{"vocab_size": 50, "n_layers": 1, "context_length": 16, "positional": {"kind": "none"},
                        "block": {"mixer": "none", "ffn": "none"}, **model})


def test_the_logits_are_the_head_of_the_normed_embeddings():
    ids = torch.arange(12).reshape(1, 12)
    model = specformer.build(_with(embedding_norm={"kind": "layernorm", "eps": 1e-3}), seed=0)
    with torch.no_grad():
        model.embedding_norm.weight.uniform_(0.5, 1.5)
        model.embedding_norm.bias.uniform_(-0.5, 0.5)
        e = model.embedding.weight[ids]  # (1, 12, 32)
        # LayerNorm written out: (e - mean) / sqrt(var + eps) * w + b, the variance biased
        mean = e.mean(-1, keepdim=True)
        var = ((e - mean) ** 2).mean(-1, keepdim=True)
        normed = (e - mean) / torch.sqrt(var + 1e-3) * model.embedding_norm.weight + model.embedding_norm.bias
        # then the final RMSNorm (eps 1e-6) and the tied head
        final = normed / torch.sqrt((normed ** 2).mean(-1, keepdim=True) + 1e-6) * model.final_norm.weight
        expected = final @ model.embedding.weight.T
        assert torch.allclose(model(ids), expected, atol=1e-5)
        assert not torch.allclose(specformer.build(_with(), seed=0)(ids), expected, atol=1e-2)


def test_a_weightless_norm_has_no_parameters_and_a_layernorm_is_counted_as_a_norm():
    plain = summarize(_with())
    weightless = summarize(_with(embedding_norm={"kind": "rmsnorm", "weight": False}))
    layernorm = summarize(_with(embedding_norm="layernorm"))
    assert weightless.total == plain.total
    assert layernorm.total == plain.total + 2 * 32
    assert layernorm.params["embedding_norm"] == 2 * 32
    assert layernorm.non_embedding == plain.non_embedding + 2 * 32
    assert layernorm.matmul_params == plain.matmul_params  # a norm multiplies no matrix


@pytest.mark.parametrize("norm", ["layernorm", {"kind": "rmsnorm", "weight": False}, "scalenorm"])
def test_the_size_check_counts_what_the_meta_build_does(norm):
    checked = check_spec(_with(embedding_norm=norm))
    assert checked.sizes.parameters == checked.shape.parameters
    model = specformer.build(_with(embedding_norm=norm), seed=0)
    assert model.num_parameters() == checked.sizes.parameters


def test_the_norm_is_saved_and_loaded_with_the_model(tmp_path):
    model = specformer.build(_with(embedding_norm="layernorm"), seed=0)
    with torch.no_grad():
        model.embedding_norm.bias.fill_(0.25)
    specformer.save(model, tmp_path / "ckpt")
    loaded = specformer.load(tmp_path / "ckpt")
    assert torch.equal(loaded.embedding_norm.bias, model.embedding_norm.bias)


def test_an_unknown_norm_is_refused_at_its_place():
    with pytest.raises(SpecError, match=r"model\.embedding_norm\.kind"):
        specformer.load_spec(_with(embedding_norm="batchnorm"))
