"""Blocks without a sublayer (``mixer: none``, ``ffn: none``): no weights for it, nothing added for it."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer_generate import StaticKVCache

from fixtures.tiny import tiny_spec

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_block_without_ffn_is_its_prenormed_mixer_and_has_no_ffn_norm() -> None:
    model = specformer.build(tiny_spec(block={"ffn": "none"}), seed=0).eval()
    block = model.blocks[0]
    assert not any(name.startswith(("ffn", "ffn_norm")) for name, _ in block.named_parameters())
    assert isinstance(block.ffn_norm, torch.nn.Identity)
    x = torch.randn(2, 5, 32)
    ctx = _context(x)
    want = x + block.mixer(block.attention_norm(x), ctx)
    torch.testing.assert_close(block(x, ctx), want, rtol=0, atol=0)


def test_a_block_without_mixer_is_its_prenormed_ffn() -> None:
    model = specformer.build(tiny_spec(block={"mixer": "none"}, positional={"kind": "none"}), seed=0).eval()
    block = model.blocks[1]
    assert [n for n, _ in block.named_parameters()] == ["ffn_norm.weight", *[f"ffn.{n}" for n, _ in block.ffn.named_parameters()]]
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(block(x, _context(x)), x + block.ffn(block.ffn_norm(x)), rtol=0, atol=0)


def test_a_shared_parallel_norm_stays_while_the_ffn_it_feeds_is_there() -> None:
    spec = tiny_spec(block={"mixer": "none", "layout": {"kind": "parallel", "shared_norm": True}},
                     positional={"kind": "none"})
    block = specformer.build(spec, seed=0).blocks[0]
    assert not isinstance(block.attention_norm, torch.nn.Identity)
    spec = tiny_spec(block={"ffn": "none", "layout": {"kind": "sandwich"}})
    block = specformer.build(spec, seed=0).blocks[0]
    assert isinstance(block.ffn_norm, torch.nn.Identity) and isinstance(block.ffn_post_norm, torch.nn.Identity)
    assert not isinstance(block.attention_post_norm, torch.nn.Identity)


def test_layers_alternating_mixer_and_ffn_decode_with_a_cache() -> None:
    spec = tiny_spec(block={"ffn": "none"}, n_layers=4)
    spec["model"]["layers"] = [{"select": "1::2", "mixer": "none", "ffn": {"kind": "mlp", "hidden": 48}}]
    model = specformer.build(spec, seed=0).eval()
    assert "none" not in " ".join(kernel for _, kernel in specformer.summarize(model).attention_kernels)  # runs nothing
    tokens = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        cache = StaticKVCache.for_model(model, batch_size=2, capacity=7)
        positions = torch.arange(7).expand(2, 7)
        got = [model(tokens[:, :4], positions=positions[:, :4], cache=cache)]
        for t in range(4, 7):
            got.append(model(tokens[:, t:t + 1], positions=positions[:, t:t + 1], cache=cache))
        torch.testing.assert_close(torch.cat(got, 1), model(tokens), rtol=1e-4, atol=1e-5)


def _context(x: torch.Tensor):
    from specformer.model.context import ForwardContext, default_positions
    from specformer_layers.positional.nope import NoPositions

    return ForwardContext(positions=default_positions(x.shape[0], x.shape[1], device="cpu"), positional=NoPositions(),
                          plain_causal=True)
