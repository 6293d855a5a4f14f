"""ALiBi: slopes as in the paper (and BLOOM's code), biases from absolute positions, SDPA and cache."""

from __future__ import annotations

import math

import pytest
import torch

import specformer
from specformer_layers.positional.alibi import ALiBi, alibi_slopes

from ..support import ListCache, tiny_spec_over_vocab


@pytest.mark.parametrize("n_heads", [1, 2, 4, 8, 16])
def test_slopes_power_of_two(n_heads: int) -> None:
    expected = [2 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)]
    assert alibi_slopes(n_heads) == pytest.approx(expected, rel=1e-12)


def test_slopes_of_the_paper() -> None:
    # Press et al. 2022, section 3: 8 heads -> 1/2, 1/4, ..., 1/256.
    assert alibi_slopes(8) == pytest.approx([1 / 2 ** i for i in range(1, 9)])
    # 6 heads: the 4 slopes of 4 heads, then slopes 1 and 3 of 8 heads.
    assert alibi_slopes(6) == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


@pytest.mark.parametrize("n_heads", [3, 5, 6, 7, 12, 20, 40])
def test_slopes_match_bloom(n_heads: int) -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    # BLOOM's bias is slope * key_position; at key position 1 it is the slope itself.
    alibi = build_alibi_tensor(torch.ones(1, 2), n_heads, torch.float32)  # (H, 1, 2)
    torch.testing.assert_close(torch.tensor(alibi_slopes(n_heads)), alibi[:, 0, 1], rtol=1e-6, atol=0)


def test_bias_formula_with_cache_positions() -> None:
    alibi = ALiBi(n_heads=4)
    q_pos = torch.tensor([[5, 6]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4, 5, 6, -1]])
    bias = alibi.attention_bias(q_pos, k_pos, None)
    assert bias.shape == (1, 4, 2, 8) and bias.dtype == torch.float32
    for h, m in enumerate(alibi_slopes(4)):
        for i, qp in enumerate(q_pos[0].tolist()):
            for j, kp in enumerate(k_pos[0].tolist()):
                assert math.isclose(bias[0, h, i, j].item(), -m * (qp - kp), rel_tol=1e-6)


def naive_alibi_attention(q, k, v, slopes):
    T = q.shape[2]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) - slopes[:, None, None] * (i - j)
    scores = scores.masked_fill(j > i, float("-inf"))
    return torch.softmax(scores, -1) @ v


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_attention_with_alibi_matches_naive(backend: str) -> None:
    spec = tiny_spec_over_vocab(positional={"kind": "alibi"}, n_layers=1)
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 4, "backend": backend}
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    attention = model.blocks[0].mixer
    seen: dict[str, torch.Tensor] = {}
    handles = [attention.register_forward_pre_hook(lambda m, args: seen.update(x=args[0])),
               attention.register_forward_hook(lambda m, args, out: seen.update(y=out))]
    model(torch.randint(0, 61, (2, 9)))
    for h in handles:
        h.remove()
    q, k, v = attention.qkv(seen["x"]).split(32, dim=-1)
    q, k, v = (t.view(2, 9, 4, 8).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hd)
    y = naive_alibi_attention(q, k, v, torch.tensor(alibi_slopes(4), dtype=torch.float64))
    torch.testing.assert_close(seen["y"], attention.out(y.transpose(1, 2).reshape(2, 9, 32)))


def test_alibi_through_a_kv_cache_matches_one_forward() -> None:
    model = specformer.build(tiny_spec_over_vocab(positional={"kind": "alibi"}), seed=0, dtype=torch.float64).eval()
    x = torch.randint(0, 61, (2, 10))
    full = model(x)
    cache = ListCache()
    steps = [model(x[:, :6], positions=torch.arange(6).expand(2, 6), cache=cache)]
    for t in range(6, 10):
        steps.append(model(x[:, t:t + 1], positions=torch.full((2, 1), t), cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_alibi_has_no_parameters_and_adds_nothing_to_embeddings() -> None:
    alibi = ALiBi(n_heads=3)
    assert list(alibi.parameters()) == [] and list(alibi.state_dict()) == []
    assert alibi.embed(torch.zeros(1, 2, dtype=torch.long)) is None
    alibi.to(torch.bfloat16)
    assert alibi.slopes.dtype == torch.float32
