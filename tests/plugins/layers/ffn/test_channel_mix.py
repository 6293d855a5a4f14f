"""The rwkv_channel_mix feed-forward (RWKV's channel mixing): written out, transformers' RwkvFeedForward, and
inside a model (packed documents, left padding) and through the caches (its shift kept as its layer's ``ffn.shift``)."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.model.context import ForwardContext
from specformer.model.state import layer_state_slots
from specformer_generate import StaticKVCache
from specformer_layers.ffn.channel_mix import ChannelMix
from specformer_layers.ffn.params import ChannelMixParams

from tests.fixtures.tiny import tiny_spec
from tests.plugins.layers.mixers.through_the_cache import (
    assert_a_left_padded_ragged_batch_equals_each_row_alone,
    assert_cached_decode_equals_the_uncached_forward,
    assert_packed_documents_equal_each_document_alone,
    assert_reorder_and_rollback_restore_the_states_exactly,
    assert_served_requests_batched_give_what_each_gives_alone,
)

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


# -- through the cache: the shift is a state beside the layer's mixer state ------------------------


def _cached_model(first: str = "rwkv4", second: str = "rwkv4"):
    """Three layers of channel mixing: layer 0's mixer is ``first``, layer 1's ``second``, layer 2's rwkv4."""
    mixers = {"rwkv4": {"kind": "rwkv4"}, "attention": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2},
              "none": {"kind": "none"}}
    spec = tiny_spec(block={"mixer": {"kind": "rwkv4"}, "ffn": {"kind": "rwkv_channel_mix", "hidden": 48}},
                     positional={"kind": "rope"}, n_layers=3)
    spec["model"]["layers"] = [{"select": "0", "mixer": mixers[first]}, {"select": "1", "mixer": mixers[second]}]
    model = specformer.build(spec, seed=0).eval()
    with torch.no_grad():  # shift weights, decays and bonuses away from their initial values
        for name, p in model.named_parameters():
            if "time_" in name:
                p.copy_(torch.rand_like(p) if "time_mix" in name else torch.randn_like(p))
    return model


#: Who claims the cache's columns in a forward: layer 0's mixer state, its keys, or (no mixer) its feed-forward.
LAYOUTS = [("rwkv4", "rwkv4"), ("rwkv4", "attention"), ("attention", "rwkv4"), ("none", "attention")]


@pytest.mark.parametrize(("first", "second"), LAYOUTS)
def test_cached_decode_equals_the_uncached_forward(first: str, second: str) -> None:
    assert_cached_decode_equals_the_uncached_forward(_cached_model(first, second))


@pytest.mark.parametrize(("first", "second"), LAYOUTS[:2])
def test_a_left_padded_ragged_batch_equals_each_row_alone(first: str, second: str) -> None:
    assert_a_left_padded_ragged_batch_equals_each_row_alone(_cached_model(first, second))


def test_packed_documents_equal_each_document_alone() -> None:
    assert_packed_documents_equal_each_document_alone(_cached_model())


@pytest.mark.parametrize(("first", "second"), LAYOUTS)
def test_reorder_and_rollback_restore_the_states_exactly(first: str, second: str) -> None:
    assert_reorder_and_rollback_restore_the_states_exactly(_cached_model(first, second))


def test_the_shift_is_kept_as_its_layers_ffn_state() -> None:
    model = _cached_model("rwkv4", "attention")
    d_model = model.d_model
    assert model.blocks[0].ffn.state_slots.shapes == {"shift": (d_model,)}
    assert layer_state_slots(model.blocks[1]).shapes == {"ffn.shift": (d_model,)}
    assert list(layer_state_slots(model.blocks[0]).shapes) == ["shift", "num", "den", "exponent", "ffn.shift"]
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=8)
    assert {i: sorted(s) for i, s in cache._states.items()} == {
        0: ["den", "exponent", "ffn.shift", "num", "shift"], 1: ["ffn.shift"],
        2: ["den", "exponent", "ffn.shift", "num", "shift"]}
    # After one forward the feed-forward's state is its input at the last token (the normed stream).
    tokens = torch.randint(0, 97, (2, 5))
    seen = {}
    hook = model.blocks[1].ffn.register_forward_hook(lambda module, args, out: seen.setdefault("x", args[0]))
    with torch.no_grad():
        model(tokens, positions=torch.arange(5).expand(2, 5), cache=cache)
    hook.remove()
    torch.testing.assert_close(cache._states[1]["ffn.shift"], seen["x"][:, -1])
    assert cache.read_state(1, torch.zeros(2, 1, dtype=torch.long), part="ffn").keys() == {"shift"}
    with pytest.raises(ValueError, match="layer 1's ffn keeps the states \\['shift'\\], got \\['conv'\\]"):
        cache.write_state(1, {"conv": torch.zeros(2, d_model)}, part="ffn")
    with pytest.raises(KeyError, match="layer 1's mixer keeps no state in this cache"):
        cache.read_state(1, torch.zeros(2, 1, dtype=torch.long))


def test_the_summary_and_the_memory_plan_count_the_shift() -> None:
    from specformer_generate.memory import estimate

    spec = tiny_spec(block={"mixer": {"kind": "rwkv4"}, "ffn": {"kind": "rwkv_channel_mix", "hidden": 48}},
                     positional={"kind": "none"}, n_layers=2)
    plain = tiny_spec(block={"mixer": {"kind": "rwkv4"}}, positional={"kind": "none"}, n_layers=2)
    d_model = spec["model"]["d_model"]
    # Per layer: the time mixing's shift, num, den and exponent (width = d_model), and the channel mixing's shift.
    assert specformer.summarize(spec).state_elements_per_sequence == 2 * 5 * d_model
    assert specformer.summarize(plain).state_elements_per_sequence == 2 * 4 * d_model
    model = _model()
    with_shift = estimate(model, rows=3, width=4, new_tokens=2, candidates=0)
    without = estimate(specformer.build(plain, seed=0), rows=3, width=4, new_tokens=2, candidates=0)
    assert with_shift.cache - without.cache == 3 * 2 * d_model * 4  # rows x layers x D float32


def test_served_requests_batched_give_what_each_gives_alone() -> None:
    """The serve engine's paged cache keeps the shift per request beside the time mixing's state."""
    assert_served_requests_batched_give_what_each_gives_alone(_cached_model("rwkv4", "attention"))


def test_parameters_counted_as_built() -> None:
    spec = tiny_spec(block={"mixer": {"kind": "rwkv4"}, "ffn": {"kind": "rwkv_channel_mix", "hidden": 48}},
                     positional={"kind": "none"}, n_layers=2)
    assert specformer.summarize(spec).total == sum(p.numel() for p in _model().parameters())
