"""LFM2's gated short convolution: the formula written out, transformers' Lfm2ShortConv, and a hybrid model's caches.

A model whose layers are mostly ``short_conv`` with some attention layers must give, through
the generate plugin's static cache, exactly what the uncached forward gives: token by token,
for left-padded ragged batches, for packed documents, for beams (reordered states) and for
speculative decoding (states rolled back to the last kept draft).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import specformer
from specformer.errors import SpecError
from specformer.model.attention import cache_slots_of, heads_of, reach_of
from specformer.model.context import ForwardContext
from specformer.model.state import StateSlots, uses_positions
from specformer_generate import StaticKVCache, generate
from specformer_layers.mixers.short_conv import ShortConv
from specformer_layers.mixers.short_conv_params import ShortConvParams

from tests.fixtures.tiny import tiny_spec

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest (tests/conftest.py)

ATTENTION = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}


def reference(x: torch.Tensor, conv: ShortConv) -> torch.Tensor:
    """out(C * conv(B * x)) with the convolution as a sum over each channel's last K inputs (zeros before the row)."""
    d = x.shape[-1]
    projected = x @ conv.in_proj.weight.T
    if conv.in_proj.bias is not None:
        projected = projected + conv.in_proj.bias
    b, c, v = projected[..., :d], projected[..., d:2 * d], projected[..., 2 * d:]
    gated = b * v
    kernel = conv.conv_weight.shape[1]
    mixed = torch.zeros_like(gated)
    for row in range(x.shape[0]):
        for t in range(x.shape[1]):
            for channel in range(d):
                total = conv.conv_bias[channel].clone() if conv.conv_bias is not None else torch.tensor(0.0)
                for j in range(kernel):
                    source = t - (kernel - 1) + j  # weight j reads the input K-1-j tokens back
                    if source >= 0:
                        total = total + conv.conv_weight[channel, j] * gated[row, source, channel]
                mixed[row, t, channel] = total
    y = c * mixed
    out = y @ conv.out.weight.T
    return out if conv.out.bias is None else out + conv.out.bias


def context(x: torch.Tensor) -> ForwardContext:
    positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    return ForwardContext(positions=positions, positional=None, plain_causal=True)  # type: ignore[arg-type]


@pytest.mark.parametrize("kernel, bias", [(2, False), (3, True), (4, False)])
def test_matches_the_formula_written_out(kernel: int, bias: bool) -> None:
    torch.manual_seed(kernel)
    conv = ShortConv(ShortConvParams(kernel=kernel, bias=bias, conv_bias=bias), d_model=6)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    x = torch.randn(2, 7, 6)
    torch.testing.assert_close(conv(x, context(x)), reference(x, conv), rtol=1e-5, atol=1e-5)


def test_public_facts() -> None:
    conv = ShortConv(ShortConvParams(kernel=4), d_model=8, layer_index=3)
    assert conv.state_slots == StateSlots((("conv", (8, 3)),))
    assert conv.layer_index == 3 and heads_of(conv) is None  # one width-wide operation: no heads
    assert not hasattr(conv, "window") and not hasattr(conv, "cache_slots")
    assert (reach_of(conv), cache_slots_of(conv), uses_positions(conv)) == (None, None, False)
    assert [name for name, _ in conv.named_parameters()] == ["conv_weight", "in_proj.weight", "out.weight"]


@pytest.mark.parametrize("kernel, conv_bias", [(3, False), (4, True)])
def test_equals_transformers_lfm2_short_conv(kernel: int, conv_bias: bool) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    config = transformers.Lfm2Config(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                     conv_L_cache=kernel, conv_bias=conv_bias, full_attn_idxs=[])
    torch.manual_seed(0)
    theirs = Lfm2ShortConv(config, layer_idx=0).eval()
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    ours = ShortConv(ShortConvParams(kernel=kernel, bias=conv_bias, conv_bias=conv_bias), d_model=16)
    with torch.no_grad():
        ours.in_proj.weight.copy_(theirs.in_proj.weight)
        ours.out.weight.copy_(theirs.out_proj.weight)
        ours.conv_weight.copy_(theirs.conv.weight.squeeze(1))  # (C, 1, K) -> (C, K)
        if conv_bias:
            ours.in_proj.bias.copy_(theirs.in_proj.bias)
            ours.out.bias.copy_(theirs.out_proj.bias)
            ours.conv_bias.copy_(theirs.conv.bias)
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, context(x)), theirs(x), rtol=1e-5, atol=1e-5)


# -- through a whole hybrid model ---------------------------------------------------------------

#: Which layers are attention: after a recurrent first layer (it claims the cache's columns), or first.
PATTERNS = {"conv-first": 1, "attention-first": "0::3"}


def hybrid(attention_layers: int | str, *, kernel: int = 3, seed: int = 0) -> nn.Module:
    # init_std well above the default: the mixers then move the greedy tokens, so a wrong state shows in them.
    spec = tiny_spec(n_layers=4, block={"mixer": {"kind": "short_conv", "kernel": kernel}},
                     layers=[{"select": attention_layers, "mixer": ATTENTION}], init_std=0.3)
    return specformer.build(spec, seed=seed).eval()


@pytest.fixture(scope="module", params=list(PATTERNS))
def model(request) -> nn.Module:
    return hybrid(PATTERNS[request.param], kernel=3 if request.param == "conv-first" else 4)


def test_the_spec_builds_the_mixers_it_names(model) -> None:
    kinds = [type(block.mixer).__name__ for block in model.blocks]
    assert kinds.count("ShortConv") == 4 - kinds.count("CausalSelfAttention") >= 2


def test_cached_decode_equals_the_uncached_forward(model) -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 97, (2, 11))
    with torch.no_grad():
        whole = model(ids)
        cache = StaticKVCache.for_model(model, batch_size=2, capacity=11)
        pieces = [model(ids[:, :5], positions=torch.arange(5).expand(2, 5), cache=cache)]
        for t in range(5, 11):
            pieces.append(model(ids[:, t:t + 1], positions=torch.full((2, 1), t), cache=cache))
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-5, atol=1e-5)


def test_a_left_padded_ragged_batch_gives_each_row_what_it_gives_alone(model) -> None:
    rows = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [30, 31, 32, 33, 34]]
    width, new = 7, 4
    ids = torch.zeros(3, width, dtype=torch.long)
    positions = torch.full((3, width), -1)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        ids[i, :width - len(row)] = 90 + i  # padding that would change the state if it entered it
        positions[i, width - len(row):] = torch.arange(len(row))
    follow = torch.randint(0, 97, (3, new), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cache = StaticKVCache.for_model(model, batch_size=3, capacity=width + new)
        batched = [model(ids, positions=positions, cache=cache)[:, -1:]]
        for t in range(new):
            step_positions = torch.tensor([[len(row) + t] for row in rows])
            batched.append(model(follow[:, t:t + 1], positions=step_positions, cache=cache))
        for i, row in enumerate(rows):
            alone = model(torch.cat((torch.tensor([row]), follow[i:i + 1]), 1))[:, len(row) - 1:]
            # The batched rows and the row alone go through other kernels (cached steps, another matmul shape), whose
            # float32 sums round differently by CPU (2e-5 apart on PyTorch's `default` kernels); padding that entered
            # the state would be off by the size of the logits (init_std 0.3).
            torch.testing.assert_close(torch.cat([b[i:i + 1] for b in batched], 1), alone, rtol=1e-4, atol=1e-4)
    assert generate(model, rows, max_new_tokens=6) == [generate(model, [row], max_new_tokens=6)[0] for row in rows]


def test_packed_documents_equal_each_document_alone(model) -> None:
    torch.manual_seed(2)
    lengths = [[4, 6, 2], [12]]
    ids = torch.randint(0, 97, (2, 12))
    documents = torch.tensor([sum(([d] * n for d, n in enumerate(row)), []) for row in lengths])
    positions = torch.cat([torch.cat([torch.arange(n) for n in row]) for row in lengths]).view(2, 12)
    with torch.no_grad():
        packed = model(ids, positions=positions, document_ids=documents)
        for r, row in enumerate(lengths):
            start = 0
            for n in row:
                alone = model(ids[r:r + 1, start:start + n])
                torch.testing.assert_close(packed[r:r + 1, start:start + n], alone, rtol=1e-5, atol=1e-5)
                start += n


PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [7, 8, 9], [11, 12, 11, 12, 11]]


def test_beams_reorder_the_states_exactly(model) -> None:
    cached = generate(model, PROMPTS, max_new_tokens=6, num_beams=3)
    assert cached == generate(model, PROMPTS, max_new_tokens=6, num_beams=3, use_cache=False)


def test_speculative_decoding_rolls_the_states_back_exactly(model) -> None:
    plain = generate(model, PROMPTS, max_new_tokens=12)
    draft = hybrid(PATTERNS["conv-first"], seed=1)  # a recurrent draft model: its own cache rolls back too
    for drafter in ("ngram", draft):
        assert generate(model, PROMPTS, max_new_tokens=12, draft=drafter, draft_tokens=3) == plain


def test_rollback_restores_the_state_after_the_last_kept_token(model) -> None:
    torch.manual_seed(3)
    ids = torch.randint(0, 97, (2, 10))
    with torch.no_grad():
        whole = model(ids)
        cache = StaticKVCache.for_model(model, batch_size=2, capacity=10, spare=4)
        model(ids[:, :4], positions=torch.arange(4).expand(2, 4), cache=cache)
        cache.keep_steps = True
        model(torch.randint(0, 97, (2, 4)), positions=torch.arange(4, 8).expand(2, 4), cache=cache)  # rejected drafts
        cache.rollback(4)
        model(ids[:, 4:6], positions=torch.arange(4, 6).expand(2, 2), cache=cache)  # two kept, two rejected
        cache.rollback(6)
        rest = model(ids[:, 6:], positions=torch.arange(6, 10).expand(2, 4), cache=cache)
    torch.testing.assert_close(rest, whole[:, 6:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", [0, 1])
def test_a_kernel_below_two_is_refused_in_one_line(kernel: int) -> None:
    spec = tiny_spec(block={"mixer": {"kind": "short_conv", "kernel": kernel}})
    with pytest.raises(SpecError) as info:
        specformer.build(spec)
    assert len(info.value.problems) == 1
    problem = info.value.problems[0]
    assert problem.path == "model.block.mixer.kernel", str(problem)
    assert "kernel must be at least 2" in problem.message and len(str(problem).splitlines()) == 1, str(problem)
