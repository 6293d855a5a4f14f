"""Per-layer inputs (Gemma 3n, Gemma 4): the part against its formula, and a sandwich block gating its slice in."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import specformer
from fixtures.tiny import tiny_spec
from specformer.errors import SpecError

WIDTH = 6


def _spec(**layout: object) -> dict:
    return tiny_spec(n_layers=3, per_layer_input={"kind": "per_layer_embedding", "width": WIDTH},
                     block={"layout": {"kind": "sandwich", **layout}})


def _rms(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    normed = x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return normed if weight is None else normed * weight


@torch.no_grad()
def test_the_per_layer_inputs_follow_their_formula() -> None:
    """p[l] = (rms(e W / sqrt(d))[l] * w + sqrt(width) E[token][l]) / sqrt(2), for the scaled token embedding e."""
    model = specformer.build(_spec(), seed=0).double()
    part = model.per_layer_input
    torch.nn.init.normal_(part.norm.weight)
    ids = torch.randint(0, model.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    e = model.embedding(ids)
    projected = _rms((e @ part.projection.weight.T / math.sqrt(32)).view(2, 5, 3, WIDTH), part.norm.weight)
    table = part.table.weight[ids].view(2, 5, 3, WIDTH) * math.sqrt(WIDTH)
    torch.testing.assert_close(part(ids, e), (projected + table) / math.sqrt(2), rtol=1e-12, atol=1e-12)


@torch.no_grad()
def test_each_block_gates_its_own_slice_into_the_stream_then_scales_it() -> None:
    """block(x) = s * (h + rms(P(gelu_tanh(h G) * p[l])) * w), h the sandwich block's stream after its FFN."""
    model = specformer.build(_spec(layer_scale=True), seed=1).double().eval()
    block = model.blocks[1]
    block.layer_scale.fill_(0.7)
    torch.nn.init.normal_(block.per_layer.norm.weight)
    ids = torch.randint(0, model.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    seen: dict[str, object] = {}
    hook = block.register_forward_hook(lambda _m, args, out: seen.update(x=args[0], ctx=args[1], out=out))
    model(ids)
    hook.remove()
    x, ctx = seen["x"], seen["ctx"]
    h = x + block.attention_post_norm(block.mixer(block.attention_norm(x), ctx))
    h = h + block.ffn_post_norm(block.ffn(block.ffn_norm(h)))
    p = model.per_layer_input(ids, model.embedding(ids))[:, :, 1]  # layer 1's slice
    gate = block.per_layer
    gated = F.gelu(h @ gate.gate.weight.T, approximate="tanh") * p
    expected = 0.7 * (h + _rms(gated @ gate.projection.weight.T, gate.norm.weight))
    torch.testing.assert_close(seen["out"], expected, rtol=1e-12, atol=1e-12)


def test_a_layout_that_takes_no_per_layer_input_is_refused() -> None:
    spec = _spec()
    spec["model"]["layers"] = [{"select": 2, "layout": "prenorm"}]
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec)
    [problem] = info.value.problems
    assert problem.path == "model.layers[0].layout"
    assert problem.message == ("model.per_layer_input gives every block a per-layer input, and the 'prenorm' layout takes "
                               "none; use a layout that does (sandwich)")


@pytest.mark.slow
def test_the_per_layer_inputs_decode_as_recompute() -> None:
    from specformer_generate import generate

    model = specformer.build(_spec(layer_scale=True), seed=2).double().eval()
    prompts = [[3, 1, 4, 1, 5], [9], [2, 6]]
    assert generate(model, prompts, max_new_tokens=4) == [generate(model, [p], max_new_tokens=4, use_cache=False)[0]
                                                          for p in prompts]
