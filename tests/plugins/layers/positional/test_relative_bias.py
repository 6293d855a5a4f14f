"""T5-style bucketed relative position bias: buckets from the paper's definition (and T5's and CPM-Ant's code),
the bias in attention against a written-out softmax, through a KV cache, one table shared by all layers."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import specformer
from specformer_layers.attention.kernels import Scores, sdpa_dense
from specformer_layers.positional.relative_bias import RelativeBias, relative_buckets
from specformer_layers.positional.relative_bias_params import RelativeBiasParams

from ..support import ListCache, tiny_spec_over_vocab


def paper_bucket(d: int, *, n_buckets: int, max_distance: int, bidirectional: bool) -> int:
    """The bucket of key-minus-query distance ``d``, written out from Raffel et al. 2020 (section 2.1) and T5's
    definition: half the buckets exact distances, the rest logarithmically wider up to max_distance."""
    base = 0
    if bidirectional:
        n_buckets //= 2
        base = n_buckets if d > 0 else 0
        n = abs(d)
    else:
        n = max(-d, 0)
    exact = n_buckets // 2
    if n < exact:
        return base + n
    far = exact + int(math.log(n / exact) / math.log(max_distance / exact) * (n_buckets - exact))
    return base + min(far, n_buckets - 1)


# Sizes whose log boundaries fall on no whole distance below max_distance, so the float32 logarithm of the
# code and the float64 one here choose the same buckets (the code's rounding is checked against T5's below).
@pytest.mark.parametrize(("n_buckets", "max_distance", "bidirectional"),
                         [(32, 128, False), (10, 20, False), (12, 40, True), (6, 7, True), (2, 3, False)])
def test_buckets_follow_the_paper(n_buckets: int, max_distance: int, bidirectional: bool) -> None:
    distance = torch.arange(-300, 301)
    got = relative_buckets(distance, n_buckets=n_buckets, max_distance=max_distance, bidirectional=bidirectional)
    expected = [paper_bucket(d, n_buckets=n_buckets, max_distance=max_distance, bidirectional=bidirectional)
                for d in distance.tolist()]
    assert got.tolist() == expected
    assert got.min() >= 0 and got.max() == n_buckets - 1  # every distance lands in the table, the far ones last


@pytest.mark.parametrize(("n_buckets", "max_distance", "bidirectional"),
                         [(32, 128, False), (32, 128, True), (512, 2048, True), (16, 64, True)])
def test_buckets_equal_t5s_and_cpm_ants(n_buckets: int, max_distance: int, bidirectional: bool) -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    distance = torch.arange(-3000, 3001)[None, :]
    got = relative_buckets(distance, n_buckets=n_buckets, max_distance=max_distance, bidirectional=bidirectional)
    t5 = T5Attention._relative_position_bucket(distance, bidirectional=bidirectional, num_buckets=n_buckets,
                                               max_distance=max_distance)
    assert torch.equal(got, t5)
    if bidirectional:
        from transformers.models.cpmant.configuration_cpmant import CpmAntConfig
        from transformers.models.cpmant.modeling_cpmant import CpmAntSegmentPositionEmbedding

        cpm = CpmAntSegmentPositionEmbedding(CpmAntConfig(position_bias_num_buckets=n_buckets,
                                                          position_bias_max_distance=max_distance, hidden_size=8,
                                                          num_attention_heads=2, dim_head=4, segment_types=2))
        assert torch.equal(got, cpm._position_bucket(distance.int(), num_buckets=n_buckets,
                                                     max_distance=max_distance).long())


def test_bias_is_the_table_at_the_bucket_with_cache_positions() -> None:
    scheme = RelativeBias(RelativeBiasParams(n_buckets=8, max_distance=12, bidirectional=True), n_heads=3)
    torch.nn.init.normal_(scheme.table)
    q_pos = torch.tensor([[9, 10]])
    k_pos = torch.tensor([[0, 1, 2, 3, 7, 9, 10, 11, -1]])
    bias = scheme.attention_bias(q_pos, k_pos, None)
    assert bias.shape == (1, 3, 2, 9) and bias.dtype == torch.float32
    for i, qp in enumerate(q_pos[0].tolist()):
        for j, kp in enumerate(k_pos[0].tolist()):
            bucket = paper_bucket(kp - qp, n_buckets=8, max_distance=12, bidirectional=True)
            assert bias[0, :, i, j].tolist() == scheme.table[bucket].tolist()


def relative_spec(n_layers: int = 2, **params: object) -> dict:
    spec = tiny_spec_over_vocab(positional={"kind": "relative_bias", "n_buckets": 8, "max_distance": 10, **params},
                                n_layers=n_layers)
    spec["model"]["block"]["mixer"] = {"kind": "attention", "n_heads": 3, "n_kv_heads": 1, "head_dim": 8}
    return spec


@pytest.mark.parametrize("backend", ["sdpa", "eager"])
def test_attention_with_the_bias_matches_a_written_out_softmax(backend: str) -> None:
    spec = relative_spec(n_layers=1)
    spec["model"]["block"]["mixer"]["backend"] = backend
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    attention, table = model.blocks[0].mixer, model.positional.table
    seen: dict[str, torch.Tensor] = {}
    handles = [attention.register_forward_pre_hook(lambda m, args: seen.update(x=args[0])),
               attention.register_forward_hook(lambda m, args, out: seen.update(y=out))]
    T = 13  # past max_distance: the far buckets are read
    model(torch.randint(0, 61, (2, T)))
    for h in handles:
        h.remove()
    q, k, v = attention.qkv(seen["x"]).split([24, 8, 8], dim=-1)
    q = q.view(2, T, 3, 8).transpose(1, 2)  # (B, H, T, hd)
    k, v = (t.view(2, T, 1, 8).transpose(1, 2) for t in (k, v))  # (B, 1, T, hd): one key/value head
    bias = torch.tensor([[[table[paper_bucket(j - i, n_buckets=8, max_distance=10, bidirectional=False), h].item()
                           for j in range(T)] for i in range(T)] for h in range(3)], dtype=torch.float64)
    scores = q @ k.transpose(-2, -1) / math.sqrt(8) + bias  # (B, H, T, T)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.softmax(scores, -1) @ v
    torch.testing.assert_close(seen["y"], attention.out(y.transpose(1, 2).reshape(2, T, 24)))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_through_a_kv_cache_matches_one_forward(bidirectional: bool) -> None:
    model = specformer.build(relative_spec(bidirectional=bidirectional), seed=0, dtype=torch.float64).eval()
    x = torch.randint(0, 61, (2, 14))
    full = model(x)
    cache = ListCache()
    steps = [model(x[:, :5], positions=torch.arange(5).expand(2, 5), cache=cache)]
    for t in range(5, 14):
        steps.append(model(x[:, t:t + 1], positions=torch.full((2, 1), t), cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_one_table_for_all_layers_and_learned() -> None:
    spec = relative_spec(n_layers=3)
    model = specformer.build(spec, seed=0)
    tables = [name for name, _ in model.named_parameters() if "table" in name]
    assert tables == ["positional.table"] and model.positional.table.shape == (8, 3)
    assert model.positional.table.std() > 0  # initialised, not left zero
    logits = model(torch.randint(0, 61, (1, 12)))
    logits.sum().backward()
    assert model.positional.table.grad is not None and model.positional.table.grad.abs().sum() > 0


@pytest.mark.parametrize(("params", "words"), [
    ({"n_buckets": 7, "bidirectional": True}, "even n_buckets"),
    ({"n_buckets": 8, "max_distance": 4}, "max_distance must exceed the 4 exact distances"),
    ({"n_buckets": 2, "bidirectional": True}, "at least 2 buckets"),
])
def test_bad_sizes_are_refused(params: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        RelativeBiasParams(**params)


def test_a_bias_for_other_heads_than_the_layers_is_refused() -> None:
    # What tensor parallelism would hand a layer computing on half its heads: the model's whole table.
    scheme = RelativeBias(n_heads=4)
    q = k = v = torch.zeros(1, 2, 3, 8)
    bias = scheme.attention_bias(torch.arange(3)[None], torch.arange(3)[None], None)
    with pytest.raises(ValueError, match="biases 4 heads and this attention computes on 2.*tensor parallelism"):
        sdpa_dense(q, k, v, mask=torch.ones(1, 1, 3, 3, dtype=torch.bool), bias=bias,
                   scores=Scores(scale=1.0, positional=scheme), dropout=0.0)


@pytest.mark.slow  # FlexAttention compiles on the CPU: over a minute
@pytest.mark.parametrize("bidirectional", [False, True])
def test_flex_per_score_bias_equals_the_dense_one(bidirectional: bool) -> None:
    spec = relative_spec(n_layers=1, bidirectional=bidirectional)
    x = torch.randint(0, 61, (2, 13))
    out = {}
    for backend in ("flex", "eager"):
        spec["model"]["block"]["mixer"]["backend"] = backend
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a fall-back to the dense path would compare it with itself
            out[backend] = specformer.build(spec, seed=0).eval()(x)
    torch.testing.assert_close(out["flex"], out["eager"], rtol=1e-5, atol=1e-5)


def test_a_layer_naming_its_own_scheme_gets_its_own_table_through_the_cache() -> None:
    spec = relative_spec(n_layers=3)
    spec["model"]["layers"] = [{"select": 1, "positional": {"kind": "relative_bias", "n_buckets": 6, "max_distance": 9,
                                                            "bidirectional": True}}]
    model = specformer.build(spec, seed=0, dtype=torch.float64).eval()
    tables = {name: tuple(p.shape) for name, p in model.named_parameters() if "table" in name}
    assert tables == {"positional.table": (8, 3), "layer_positionals.0.table": (6, 3)}
    x = torch.randint(0, 61, (1, 12))
    cache = ListCache()
    steps = [model(x[:, :4], positions=torch.arange(4)[None], cache=cache)]
    steps += [model(x[:, t:t + 1], positions=torch.full((1, 1), t), cache=cache) for t in range(4, 12)]
    torch.testing.assert_close(torch.cat(steps, dim=1), model(x))
