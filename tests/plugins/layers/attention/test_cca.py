"""Compressed convolutional attention (``cca``, ZAYA1): the layer written out token by token, transformers'
ZayaAttention, and exact through a model with a cache.

Through a whole model (with RoPE): a cached token-by-token decode and a prefill equal the uncached forward,
a left-padded ragged batch equals each row alone, speculative rollback (``keep_steps``) and beam reordering
restore the states exactly, and the serve engine batches requests as each alone.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from pydantic import ValidationError

import specformer
from specformer.model.attention import cache_slots_of, heads_of, reach_of
from specformer.model.state import uses_positions
from specformer_layers.attention.cca import ConvolutionalAttention
from specformer_layers.attention.cca_params import ConvolutionalAttentionParams

from tests.fixtures.tiny import tiny_spec
from tests.plugins.layers.mixers.through_the_cache import (
    assert_a_left_padded_ragged_batch_equals_each_row_alone,
    assert_cached_decode_equals_the_uncached_forward,
    assert_reorder_and_rollback_restore_the_states_exactly,
    assert_served_requests_batched_give_what_each_gives_alone,
)
from tests.plugins.layers.support import context

pytestmark = pytest.mark.usefixtures("one_thread")

MIXER = {"kind": "cca", "n_heads": 4, "n_kv_heads": 2, "head_dim": 6, "depthwise_kernel": 3, "grouped_kernel": 2}


def _layer(*, heads: int = 4, kv: int = 2, dim: int = 6, d_model: int = 12, kernels: tuple[int, int] = (2, 3),
           bias: bool = True, window: int | None = None) -> ConvolutionalAttention:
    params = ConvolutionalAttentionParams(n_heads=heads, n_kv_heads=kv, head_dim=dim, depthwise_kernel=kernels[0],
                                          grouped_kernel=kernels[1], bias=bias, window=window)
    layer = ConvolutionalAttention(params, d_model=d_model).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    return layer


def _naive(layer: ConvolutionalAttention, x: torch.Tensor, window: int | None = None) -> torch.Tensor:
    """CCA written out token by token for fresh rows (Figliolia et al. 2025 as ZAYA1 runs it), no rotation."""
    B, T, _ = x.shape
    H, KV, hd = layer.n_heads, layer.n_kv_heads, layer.head_dim
    g = H // KV
    t0, t1 = layer.depthwise_kernel, layer.grouped_kernel
    wd, bd = layer.conv_weight, layer.conv_bias  # (C, t0), (C,)
    wg, bg = layer.group_weight.view(-1, hd, t1), layer.group_bias  # (C, hd, t1): each output reads its head's hd inputs
    outs = []
    for b in range(B):
        z = {s: torch.cat((layer.q.weight @ x[b, s] + layer.q.bias, layer.k.weight @ x[b, s] + layer.k.bias))
             for s in range(T)}  # the projected queries and keys, (C,); zero before the row starts

        def z_at(s: int) -> torch.Tensor:
            return z[s] if s >= 0 else torch.zeros_like(z[0])

        def u_at(s: int) -> torch.Tensor:  # the depthwise convolution over z_{s-t0+1} .. z_s
            return bd + sum(wd[:, j] * z_at(s - (t0 - 1) + j) for j in range(t0))

        keys, values, queries = [], [], []
        for t in range(T):
            conv = bg.clone()
            for c in range(conv.shape[0]):
                head = c // hd
                for j in range(t1):
                    u = u_at(t - (t1 - 1) + j)
                    conv[c] = conv[c] + (wg[c, :, j] * u[head * hd:(head + 1) * hd]).sum()
            qp, kp = z[t][:H * hd].view(H, hd), z[t][H * hd:].view(KV, hd)
            r = torch.stack([(qp[i] + kp[i // g]) / 2 for i in range(H)])  # (H, hd)
            q = conv[:H * hd].view(H, hd) + r
            k = conv[H * hd:].view(KV, hd) + torch.stack([r[j * g:(j + 1) * g].mean(0) for j in range(KV)])
            previous = x[b, t - 1] if t > 0 else torch.zeros_like(x[b, 0])
            v = torch.cat((layer.v_current.weight @ x[b, t] + layer.v_current.bias,
                           layer.v_delayed.weight @ previous + layer.v_delayed.bias)).view(KV, hd)
            q = q / q.norm(dim=-1, keepdim=True) * math.sqrt(hd)
            k = k / k.norm(dim=-1, keepdim=True) * math.sqrt(hd) * layer.key_scale[:, None]
            queries.append(q)
            keys.append(k)
            values.append(v)
        rows = []
        for t in range(T):
            heads = []
            first = 0 if window is None else max(0, t - window + 1)
            for i in range(H):
                s = torch.stack([queries[t][i] @ keys[u][i // g] for u in range(first, t + 1)]) / math.sqrt(hd)
                p = torch.softmax(s, 0)
                heads.append(sum(p[n] * values[u][i // g] for n, u in enumerate(range(first, t + 1))))
            rows.append(layer.out.weight @ torch.cat(heads) + layer.out.bias)
        outs.append(torch.stack(rows))
    return torch.stack(outs)


@pytest.mark.parametrize(("heads", "kv", "kernels", "window", "length"),
                         [(4, 2, (2, 3), None, 7), (3, 3, (3, 2), 3, 6), (2, 1, (2, 2), None, 1), (6, 2, (4, 3), 4, 9)])
def test_equals_the_layer_written_out(heads: int, kv: int, kernels: tuple[int, int], window: int | None,
                                      length: int) -> None:
    layer = _layer(heads=heads, kv=kv, kernels=kernels, window=window)
    x = torch.randn(2, length, 12)
    positions = torch.arange(length).expand(2, length)
    with torch.no_grad():
        got = layer(x, context(positions, plain_causal=True))
        torch.testing.assert_close(got, _naive(layer, x, window), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("heads", "kv", "dim", "kernels"), [(4, 2, 6, (2, 2)), (6, 3, 4, (3, 2)), (2, 2, 8, (2, 4))])
def test_equals_transformers_zaya_attention(heads: int, kv: int, dim: int, kernels: tuple[int, int]) -> None:
    from transformers import ZayaConfig
    from transformers.models.zaya.modeling_zaya import ZayaAttention

    d_model, T = 12, 8
    config = ZayaConfig(hidden_size=d_model, num_attention_heads=heads, num_key_value_heads=kv, head_dim=dim,
                        cca_time0=kernels[0], cca_time1=kernels[1], attention_bias=True, num_hidden_layers=1,
                        vocab_size=32)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = ZayaAttention(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
    ours = _layer(heads=heads, kv=kv, dim=dim, kernels=kernels)
    projection = hf.qkv_proj
    with torch.no_grad():
        for mine, theirs in ((ours.q, projection.q_proj), (ours.k, projection.k_proj),
                             (ours.v_current, projection.v_proj_current), (ours.v_delayed, projection.v_proj_delayed),
                             (ours.out, hf.o_proj)):
            mine.load_state_dict(theirs.state_dict())
        ours.conv_weight.copy_(projection.conv_qk_depthwise.weight[:, 0])  # (C, 1, t0) -> (C, t0)
        ours.conv_bias.copy_(projection.conv_qk_depthwise.bias)
        ours.group_weight.copy_(projection.conv_qk_grouped.weight.flatten(1))  # (C, hd, t1) -> (C, hd * t1)
        ours.group_bias.copy_(projection.conv_qk_grouped.bias)
        ours.key_scale.copy_(hf.qk_norm.temp)
        x = torch.randn(2, T, d_model)
        # Rotation by cos 1, sin 0 is none, as our context's scheme (the rotation is the positional scheme's).
        still = (torch.ones(2, T, dim), torch.zeros(2, T, dim))
        want, _ = hf(x, attention_mask=None, cache=None, position_embeddings=still)
        got = ours(x, context(torch.arange(T).expand(2, T), plain_causal=True))
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


# -- through a model ------------------------------------------------------------------------------


def tiny_model(mixed: bool = False, **mixer):
    spec = tiny_spec(block={"mixer": {**MIXER, **mixer}}, positional={"kind": "rope", "fraction": 0.5}, n_layers=3)
    if mixed:
        spec["model"]["layers"] = [{"select": "1", "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}}]
    model = specformer.build(spec, seed=0).eval()
    with torch.no_grad():  # key_scale starts at zero (every key zero): move it and the biases off their start
        for name, p in model.named_parameters():
            if name.endswith(("key_scale", "conv_bias", "group_bias")):
                p.copy_(torch.randn_like(p))
    return model


@pytest.mark.parametrize("mixed", [False, True])
def test_cached_decode_equals_the_uncached_forward(mixed: bool) -> None:
    assert_cached_decode_equals_the_uncached_forward(tiny_model(mixed))


@pytest.mark.parametrize("mixer", [{}, {"window": 3, "bias": True}])
def test_a_left_padded_ragged_batch_equals_each_row_alone(mixer: dict) -> None:
    assert_a_left_padded_ragged_batch_equals_each_row_alone(tiny_model(True, **mixer))


def test_reorder_and_rollback_restore_the_states_exactly() -> None:
    assert_reorder_and_rollback_restore_the_states_exactly(tiny_model(mixed=True))


def test_served_requests_batched_give_what_each_gives_alone() -> None:
    assert_served_requests_batched_give_what_each_gives_alone(tiny_model(mixed=True))


def test_public_facts_and_size() -> None:
    layer = tiny_model().blocks[0].mixer
    assert heads_of(layer) is not None and (layer.n_heads, layer.n_kv_heads, layer.head_dim) == (4, 2, 6)
    assert reach_of(layer) is None and uses_positions(layer)
    assert cache_slots_of(layer).elements_per_token == 2 * 2 * 6
    assert layer.state_slots.shapes == {"conv": ((4 + 2) * 6, 3), "value": (6,)}
    for mixer in (MIXER, {**MIXER, "bias": True, "window": 5, "n_heads": 3, "n_kv_heads": 1, "head_dim": 8}):
        spec = tiny_spec(block={"mixer": mixer}, positional={"kind": "rope"}, n_layers=2)
        built = specformer.build(spec, seed=0)
        assert specformer.summarize(spec).total == sum(p.numel() for p in built.parameters())


def test_packed_documents_and_tensor_parallelism_are_refused_in_one_line() -> None:
    model = tiny_model()
    with pytest.raises(ValueError, match="cca convolves its queries and keys along the whole row"):
        model(torch.randint(0, 97, (1, 6)), document_ids=torch.tensor([[0, 0, 0, 1, 1, 1]]))
    with pytest.raises(ValueError, match="tensor parallelism does not split cca"):
        model.blocks[0].mixer.take_tensor_parallel_share(object())


@pytest.mark.parametrize(("change", "message", "where"), [
    ({"n_heads": 0}, "greater than 0", "model.block.mixer.n_heads: "),
    ({"depthwise_kernel": 1}, "depthwise_kernel must be at least 2", "model.block.mixer.depthwise_kernel: "),
    ({"n_kv_heads": 3}, r"n_kv_heads \(3\) must divide n_heads \(4\)", "model.block.mixer: "),
    ({"n_kv_heads": 1, "head_dim": 5}, r"must be even", "model.block.mixer: "),
])
def test_bad_params_are_one_clear_line(change: dict, message: str, where: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ConvolutionalAttentionParams(**{**{k: v for k, v in MIXER.items() if k != "kind"}, **change})
    with pytest.raises(Exception, match=message) as caught:
        specformer.build(tiny_spec(block={"mixer": {**MIXER, **change}}, positional={"kind": "rope"}), seed=0)
    lines = [line for line in str(caught.value).splitlines() if re.search(message, line)]
    assert len(lines) == 1 and lines[0].strip().startswith(where)
