"""Cross-layer KV sharing (``kv_from``), keys as values (``k_eq_v``) and the value norm (``v_norm``).

The numbers are checked against the attention written out here (no positions, so the
formula is projections and a causal softmax); the caches against recomputing; bad specs
against the one line each gets.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specformer
from fixtures.recurrent import beam_search_by_recompute
from fixtures.caching import cached_logits
from fixtures.tiny import tiny_spec
from specformer.errors import SpecError
from specformer.model.summary import summarize
from specformer_generate import StaticKVCache, generate
from specformer_generate.memory import estimate

WINDOW = 5


def shared_spec(*, window: int | None = None, **attention: Any) -> dict[str, Any]:
    """Four layers; layers 2 and 3 read layer 1's keys and values (as Gemma 4's last layers read the last own ones)."""
    base = {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": window, **attention}
    return tiny_spec(n_layers=4, block={"mixer": base},
                     layers=[{"select": "2:", "mixer": {"kv_from": 1}}])


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(hd) + causal) v, each query head reading kv head h // (H / KV): (B, H, T, hd)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    future = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


def _inputs_of(model: Any, ids: torch.Tensor) -> list[torch.Tensor]:
    """The input of every layer's attention in a forward of ``ids``."""
    seen: list[torch.Tensor] = []
    hooks = [block.mixer.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
             for block in model.blocks]
    model(ids)
    for hook in hooks:
        hook.remove()
    return seen


@torch.no_grad()
def test_a_sharing_layer_attends_to_the_source_layers_keys_and_values() -> None:
    """Layer 3's output = out(softmax(q3 k1^T / sqrt(hd)) v1), with k1, v1 projected by layer 1 from its own input."""
    spec = shared_spec()
    spec["model"]["positional"] = {"kind": "none"}
    model = specformer.build(spec, seed=0).double().eval()
    ids = torch.randint(0, model.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    x = _inputs_of(model, ids)
    source, reader = model.blocks[1].mixer, model.blocks[3].mixer
    B, T, H, KV, hd = 2, 7, 4, 2, 8
    _q, k1, v1 = source.qkv(x[1]).split((H * hd, KV * hd, KV * hd), -1)
    q3 = reader.qkv(x[3])  # queries only: the reader has no key or value rows
    assert reader.qkv.weight.shape == (H * hd, 32) and reader.k_norm is None
    heads = lambda t, n: t.view(B, T, n, hd).transpose(1, 2)  # noqa: E731  (B, n, T, hd)
    y = _causal_attention(heads(q3, H), heads(k1, KV), heads(v1, KV)).transpose(1, 2).reshape(B, T, H * hd)
    expected = reader.out(y)
    outputs: list[torch.Tensor] = []  # the reader cannot run alone: its keys come from layer 1 in the same forward
    hook = reader.register_forward_hook(lambda _m, _a, out: outputs.append(out))
    model(ids)
    hook.remove()
    torch.testing.assert_close(outputs[0], expected, rtol=1e-10, atol=1e-10)


@torch.no_grad()
def test_keys_as_values_and_the_value_norm_follow_their_formula() -> None:
    """k_eq_v: v = k_proj(x) before the key's norm and rotation; v_norm: v / sqrt(mean(v^2) + eps) per head."""
    spec = tiny_spec(n_layers=1, positional={"kind": "none"},
                     block={"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "k_eq_v": True,
                                          "qk_norm": "rmsnorm", "v_norm": {"kind": "rmsnorm", "weight": False,
                                                                           "eps": 1e-6}}})
    model = specformer.build(spec, seed=1).double().eval()
    attention = model.blocks[0].mixer
    torch.nn.init.normal_(attention.k_norm.weight)  # a key norm that changes the keys, so v != k shows
    ids = torch.randint(0, model.vocab_size, (2, 6), generator=torch.Generator().manual_seed(1))
    x = _inputs_of(model, ids)[0]
    B, T, H, KV, hd = 2, 6, 4, 2, 8
    assert attention.qkv.weight.shape == ((H + KV) * hd, 32)  # no value rows
    q, k = attention.qkv(x).split((H * hd, KV * hd), -1)
    q, k = q.view(B, T, H, hd).transpose(1, 2), k.view(B, T, KV, hd).transpose(1, 2)
    v = k / (k.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    rms = lambda t, w: t / (t.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt() * w  # noqa: E731
    q, k = rms(q, attention.q_norm.weight), rms(k, attention.k_norm.weight)
    expected = attention.out(_causal_attention(q, k, v).transpose(1, 2).reshape(B, T, H * hd))
    outputs: list[torch.Tensor] = []
    hook = attention.register_forward_hook(lambda _m, _a, out: outputs.append(out))
    model(ids)
    hook.remove()
    torch.testing.assert_close(outputs[0], expected, rtol=1e-10, atol=1e-10)


def test_sharing_layers_keep_no_cache_and_cost_no_cache_bytes() -> None:
    model = specformer.build(shared_spec(), seed=0)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=9)
    assert cache.slot_counts() == {0: 9, 1: 9}  # layers 2 and 3 keep nothing of their own
    per_layer = 2 * 2 * 8 * 4  # keys and values, 2 kv heads x 8 channels, float32
    assert summarize(model).kv_bytes_per_token(torch.float32) == 2 * per_layer
    assert estimate(model, rows=2, width=4, new_tokens=5).cache == 2 * 9 * 2 * per_layer + 2 * 9 * 8


@pytest.mark.parametrize("window", [None, WINDOW], ids=["full", "sliding"])
@torch.no_grad()
def test_decoding_through_the_cache_equals_recompute(window: int | None) -> None:
    model = specformer.build(shared_spec(window=window), seed=2).double().eval()
    ids = torch.randint(0, model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(2))
    decoded, _ = cached_logits(model, ids, prompt=7)  # past the window: the ring wraps
    torch.testing.assert_close(decoded, model(ids), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("window", [pytest.param(None, marks=pytest.mark.slow), WINDOW], ids=["full", "sliding"])
@torch.no_grad()
def test_ragged_prompts_beams_and_drafts_equal_recompute(window: int | None) -> None:
    model = specformer.build(shared_spec(window=window), seed=3).double().eval()
    prompts = [[3, 1, 4, 1, 5, 9, 2], [6], [5, 3, 5]]  # left-padded together
    assert generate(model, prompts, max_new_tokens=5) == [generate(model, [p], max_new_tokens=5, use_cache=False)[0]
                                                          for p in prompts]
    prompt = torch.tensor([[7, 2, 9, 4]])
    assert generate(model, prompt, max_new_tokens=4, num_beams=3)[0].tolist() == \
        beam_search_by_recompute(model, prompt, beams=3, steps=4)
    draft = specformer.build(shared_spec(window=window), seed=4).double().eval()  # mostly wrong drafts: rollbacks
    want = generate(model, prompt, max_new_tokens=9, use_cache=False)
    assert torch.equal(generate(model, prompt, max_new_tokens=9, draft=draft, draft_tokens=3), want)


def _problem(spec: dict[str, Any], **registry: Any) -> tuple[str, str]:
    with pytest.raises(SpecError) as info:
        specformer.load_spec(spec, **registry)
    problems = info.value.problems
    assert len(problems) == 1, problems
    return problems[0].path, problems[0].message


def test_a_layer_cannot_share_the_kv_of_itself_or_a_later_layer() -> None:
    spec = tiny_spec(n_layers=4, layers=[{"select": 2, "mixer": {"kv_from": 2}}])
    path, message = _problem(spec)
    assert path == "model.layers[0].mixer" and "kv_from (2) must name an earlier layer than this one (2)" in message
    spec["model"]["layers"][0]["mixer"]["kv_from"] = 3
    assert "kv_from (3) must name an earlier layer" in _problem(spec)[1]


def test_the_source_must_have_the_same_head_layout() -> None:
    spec = tiny_spec(n_layers=3, layers=[{"select": 0, "mixer": {"n_kv_heads": 4}},
                                         {"select": 2, "mixer": {"kv_from": 0}}])
    path, message = _problem(spec)
    assert path == "model.layers[1].mixer.kv_from"
    assert "layer 0 keeps keys of 4 heads x 8" in message and "reads 2 heads x 8" in message and "n_kv_heads" in message


def test_the_source_must_keep_keys_and_values_of_its_own() -> None:
    recurrent = tiny_spec(n_layers=3, layers=[{"select": 0, "mixer": {"kind": "gated_deltanet", "n_heads": 4}},
                                              {"select": 2, "mixer": {"kv_from": 0}}])
    path, message = _problem(recurrent)
    assert path == "model.layers[1].mixer.kv_from"
    assert message.startswith("layer 0 (GatedDeltaNet) keeps no keys and values to share")
    chained = tiny_spec(n_layers=3, layers=[{"select": 1, "mixer": {"kv_from": 0}},
                                            {"select": 2, "mixer": {"kv_from": 1}}])
    assert "layer 1 itself reads layer 0's keys and values; name that layer (0)" in _problem(chained)[1]


def test_the_source_must_see_as_far_back_as_the_reader() -> None:
    spec = tiny_spec(n_layers=3, layers=[{"select": 0, "mixer": {"window": 4}},
                                         {"select": 2, "mixer": {"kv_from": 0}}])
    assert "layer 0 keeps only its last 4 tokens (its window), this layer reads every earlier token" in _problem(spec)[1]


def test_a_sharing_layer_takes_no_key_or_value_settings() -> None:
    spec = tiny_spec(n_layers=3, layers=[{"select": 2, "mixer": {"kv_from": 0, "k_eq_v": True}}])
    path, message = _problem(spec)
    assert path == "model.layers[0].mixer" and "projects no keys or values, so k_eq_v and v_norm do not apply" in message
