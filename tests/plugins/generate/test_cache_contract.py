"""The cache contract from a third party's side: an attention declares what it keeps per token.

Two attentions written here as another plugin would write them (registered in a registry
of their own, nothing in the generate plugin edited): one keeps nothing (it reads only its
own token), one keeps a single narrow key and a wider value. The cache, ``summary`` and
the memory estimate are laid out from their declarations, and generation through the
cache equals recompute.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from pydantic import Field
from torch import Tensor, nn

import specformer
from fixtures.caching import cached_logits
from specformer.registry import discovery
from specformer.model.attention import CacheSlots
from specformer.model.context import ForwardContext
from specformer.registry.params import Params
from specformer.model.summary import summarize
from specformer_generate import StaticKVCache, generate
from specformer_generate.memory import estimate
from specformer_layers.attention import attention_mask
from fixtures.tiny import tiny_spec

VOCAB = 41


class OwnTokenOnly(nn.Module):
    """Each token reads only itself (a value projection): it needs nothing from earlier steps."""

    class Params(Params):
        n_heads: int = Field(gt=0)

    def __init__(self, params: "OwnTokenOnly.Params", *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        n_heads = params.n_heads
        self.n_heads, self.n_kv_heads, self.head_dim, self.window = n_heads, n_heads, d_model // n_heads, None
        self.layer_index = layer_index
        self.cache_slots = None  # keeps nothing per token
        self.value = nn.Linear(d_model, d_model)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        return self.value(x)


class NarrowKeyWideValue(nn.Module):
    """Every head queries one shared 6-channel (rotated) key and reads one shared 10-channel value."""

    class Params(Params):
        n_heads: int = Field(gt=0)

    def __init__(self, params: "NarrowKeyWideValue.Params", *, d_model: int, layer_index: int = 0) -> None:
        super().__init__()
        n_heads = params.n_heads
        self.n_heads, self.n_kv_heads, self.head_dim, self.window = n_heads, 1, 6, None
        self.layer_index = layer_index
        self.positional_dim = 6
        self.cache_slots = CacheSlots(key_heads=1, key_dim=6, value_heads=1, value_dim=10)
        self.q = nn.Linear(d_model, n_heads * 6)
        self.kv = nn.Linear(d_model, 6 + 10)
        self.out = nn.Linear(n_heads * 10, d_model)

    def forward(self, x: Tensor, ctx: ForwardContext) -> Tensor:
        B, T, _ = x.shape
        q = self.q(x).view(B, T, self.n_heads, 6).transpose(1, 2)  # (B, H, T, 6)
        k, v = self.kv(x)[:, None].split((6, 10), dim=-1)  # (B, 1, T, 6), (B, 1, T, 10)
        positional, state = ctx.positional_for(self.layer_index), ctx.positional_state_for(self.layer_index)
        q, k = positional.rotate(q, state), positional.rotate(k, state)
        if ctx.cache is not None:
            k, v, k_positions = ctx.cache.update(self.layer_index, k, v, ctx.positions)
        else:
            k_positions = ctx.positions
        mask = attention_mask(ctx, k_positions)  # (B, 1, T, S)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(6)  # (B, H, T, S)
        weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
        y = weights @ v  # (B, H, T, 10)
        return self.out(y.transpose(1, 2).reshape(B, T, -1))


@pytest.fixture(scope="module")
def registry() -> Any:
    registry = discovery.build_registry(discovery.get_plugin_manager())
    third_party = registry.for_plugin("third-party")
    for name, cls in (("own_token", OwnTokenOnly), ("narrow_key", NarrowKeyWideValue)):
        third_party.register("mixer", name, factory=cls, params=cls.Params, doc=cls.__doc__)
    return registry


def spec(n_layers: int = 3) -> dict[str, Any]:
    return tiny_spec(vocab_size=VOCAB, d_model=24, n_layers=n_layers, context_length=64, tie_embeddings=False,
                     init_std=0.3, block={"mixer": {"kind": "narrow_key", "n_heads": 4},
                                          "ffn": {"kind": "swiglu", "hidden": 32}},
                     layers=[{"select": 1, "mixer": {"kind": "own_token", "n_heads": 4}}])


def test_the_cache_is_laid_out_from_each_layers_declaration(registry: Any) -> None:
    model = specformer.build(spec(), registry=registry, seed=0)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=9)
    assert cache.slot_counts() == {0: 9, 2: 9}  # layer 1 keeps nothing
    layer = cache._layers[0]
    assert layer.keys.shape == (2, 1, 9, 6) and layer.values.shape == (2, 1, 9, 10)
    assert summarize(model).kv_bytes_per_token(torch.float32) == 2 * (6 + 10) * 4
    assert estimate(model, rows=2, width=4, new_tokens=5).cache == 2 * 9 * 2 * (6 + 10) * 4 + 2 * 9 * 8


@torch.no_grad()
def test_generation_with_the_cache_equals_recompute(registry: Any) -> None:
    model = specformer.build(spec(), registry=registry, seed=1).double().eval()
    prompt = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(0))
    cached = generate(model, prompt, max_new_tokens=12)
    assert torch.equal(cached, generate(model, prompt, max_new_tokens=12, use_cache=False))
    ids = cached[:, :12].clone()  # generate's output is an inference tensor
    torch.testing.assert_close(cached_logits(model, ids, prompt=4)[0], model(ids), rtol=1e-10, atol=1e-10)
    assert F.mse_loss(model(ids), model(ids.flip(1))) > 0  # the narrow key layers do read other tokens
