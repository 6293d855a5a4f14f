"""The rwkv_channel_mix feed-forward (RWKV's channel mixing): written out, transformers' RwkvFeedForward, and
inside a model (packed documents, left padding, the refused cache)."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.model.context import ForwardContext
from specformer_generate import StaticKVCache
from specformer_layers.ffn.channel_mix import ChannelMix
from specformer_layers.ffn.params import ChannelMixParams

from tests.fixtures.tiny import tiny_spec

pytestmark = pytest.mark.usefixtures("one_thread")


def _randomised(layer: ChannelMix) -> ChannelMix:
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        layer.time_mix_key.uniform_(0, 1)
        layer.time_mix_receptance.uniform_(0, 1)
    return layer


def _written_out(layer: ChannelMix, x: torch.Tensor) -> torch.Tensor:
    """Peng et al. 2023, eqs. 17-19, token by token: r' = W_r (mu_r x_t + (1 - mu_r) x_{t-1}), k' likewise,
    o = sigmoid(r') * W_v max(k', 0)²; the first token's x_{t-1} is zero."""
    outs = []
    for t in range(x.shape[1]):
        previous = x[:, t - 1] if t else torch.zeros_like(x[:, 0])
        mu_k, mu_r = layer.time_mix_key, layer.time_mix_receptance
        k = layer.key.weight @ (mu_k * x[:, t] + (1 - mu_k) * previous).T  # (hidden, B)
        r = layer.receptance.weight @ (mu_r * x[:, t] + (1 - mu_r) * previous).T  # (D, B)
        outs.append((torch.sigmoid(r) * (layer.value.weight @ torch.clamp(k, min=0) ** 2)).T)
    return torch.stack(outs, dim=1)


def _ctx(length: int, **kw) -> ForwardContext:
    return ForwardContext(positions=torch.arange(length)[None], positional=None, plain_causal=True, **kw)


@pytest.mark.parametrize(("hidden", "length"), [(None, 7), (20, 1)])
def test_equals_the_channel_mixing_written_out(hidden: int | None, length: int) -> None:
    torch.manual_seed(0)
    layer = _randomised(ChannelMix(ChannelMixParams(hidden=hidden), d_model=8))
    x = torch.randn(2, length, 8)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, _ctx(length)), _written_out(layer, x), rtol=1e-5, atol=1e-5)


def test_equals_transformers_feed_forward() -> None:
    from transformers import RwkvConfig
    from transformers.models.rwkv.modeling_rwkv import RwkvFeedForward

    config = RwkvConfig(hidden_size=16, intermediate_size=40, num_hidden_layers=1)
    torch.manual_seed(0)
    hf = RwkvFeedForward(config, layer_id=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    ours = ChannelMix(ChannelMixParams(hidden=40), d_model=16)
    with torch.no_grad():
        for name in ("key", "value", "receptance"):
            getattr(ours, name).load_state_dict(getattr(hf, name).state_dict())
        ours.time_mix_key.copy_(hf.time_mix_key.reshape(-1))
        ours.time_mix_receptance.copy_(hf.time_mix_receptance.reshape(-1))
        x = torch.randn(2, 9, 16)
        want, _ = hf(x)
        torch.testing.assert_close(ours(x, _ctx(9)), want, rtol=1e-4, atol=1e-5)


def _model():
    spec = tiny_spec(block={"mixer": {"kind": "rwkv4"}, "ffn": {"kind": "rwkv_channel_mix", "hidden": 48}},
                     positional={"kind": "none"}, n_layers=2)
    model = specformer.build(spec, seed=0).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "time_mix" in name:
                p.uniform_(0, 1)
    return model


def test_packed_documents_and_left_padding_equal_each_alone() -> None:
    model = _model()
    tokens = torch.randint(0, 97, (2, 10))
    documents = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2], [5, 5, 5, 5, 5, 5, 7, 7, 7, 7]])
    with torch.no_grad():
        got = model(tokens, document_ids=documents)
        for row, cuts in ((0, [(0, 3), (3, 7), (7, 10)]), (1, [(0, 6), (6, 10)])):
            for a, b in cuts:
                torch.testing.assert_close(got[row, a:b], model(tokens[row:row + 1, a:b])[0], rtol=1e-4, atol=1e-5)
        # Row 1 opens with four padding tokens (negative positions): its six tokens as if alone.
        positions = torch.stack((torch.arange(10), torch.tensor([-1] * 4 + list(range(6)))))
        got = model(tokens, positions=positions)
        torch.testing.assert_close(got[1, 4:], model(tokens[1:, 4:])[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got[0], model(tokens[:1])[0], rtol=1e-4, atol=1e-5)


def test_a_cached_forward_is_refused_naming_why() -> None:
    model = _model()
    cache = StaticKVCache.for_model(model, batch_size=1, capacity=8)
    with torch.no_grad(), pytest.raises(NotImplementedError, match="rwkv_channel_mix.*cache keeps states only"):
        model(torch.tensor([[1, 2, 3]]), positions=torch.arange(3)[None], cache=cache)


def test_parameters_counted_as_built() -> None:
    spec = tiny_spec(block={"mixer": {"kind": "rwkv4"}, "ffn": {"kind": "rwkv_channel_mix", "hidden": 48}},
                     positional={"kind": "none"}, n_layers=2)
    assert specformer.summarize(spec).total == sum(p.numel() for p in _model().parameters())
