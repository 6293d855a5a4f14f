"""Gated DeltaNet: equal to transformers' Qwen3-Next, Qwen3.5 and OLMo Hybrid layers; exact under caches, padding, documents."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

import specformer
from specformer.errors import SpecError
from specformer.model.attention import cache_slots_of, reach_of
from specformer.model.context import ForwardContext
from specformer.model.positional import PositionalScheme
from specformer.model.state import uses_positions
from specformer_generate import StaticKVCache
from specformer_layers.mixers.gated_deltanet import GatedDeltaNet
from specformer_layers.mixers.gated_deltanet_params import GatedDeltaNetParams
from fixtures.tiny import tiny_spec

D_MODEL = 32
TOL = {"rtol": 1e-5, "atol": 1e-5}


# -- against transformers' modules ------------------------------------------------------------


def _hf_config(family: str, *, key_heads: int, value_heads: int, key_dim: int, value_dim: int, kernel: int) -> Any:
    sizes = dict(hidden_size=D_MODEL, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                 linear_num_key_heads=key_heads, linear_num_value_heads=value_heads, linear_key_head_dim=key_dim,
                 linear_value_head_dim=value_dim, linear_conv_kernel_dim=kernel, rms_norm_eps=1e-6,
                 layer_types=["linear_attention"], vocab_size=11, intermediate_size=16)
    if family == "qwen3_next":
        from transformers import Qwen3NextConfig
        return Qwen3NextConfig(**sizes)
    if family == "qwen3_5":
        from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
        return Qwen3_5TextConfig(**sizes)
    from transformers import OlmoHybridConfig
    return OlmoHybridConfig(**{**sizes, "num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]})


def _hf_layer(family: str, config: Any) -> torch.nn.Module:
    if family == "qwen3_next":
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet as Layer
    elif family == "qwen3_5":
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet as Layer
    else:
        from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridGatedDeltaNet as Layer
    return Layer(config, layer_idx=0)


def _copy_weights(family: str, theirs: torch.nn.Module, ours: GatedDeltaNet) -> None:
    """Their tensors into our names (what the hf plugin's weight rules do for checkpoints)."""
    Hk, Hv, dk, dv = ours.n_kv_heads, ours.n_heads, ours.key_head_dim, ours.head_dim
    with torch.no_grad():
        if family == "qwen3_next":
            # Rows grouped per key head: [q (dk), k (dk), v (r*dv), z (r*dv)] and [b (r), a (r)], r = Hv / Hk.
            r = Hv // Hk
            qkvz = theirs.in_proj_qkvz.weight.view(Hk, 2 * dk + 2 * r * dv, D_MODEL)
            q, k, v, z = qkvz.split((dk, dk, r * dv, r * dv), dim=1)
            ours.qkv.weight.copy_(torch.cat([q.reshape(-1, D_MODEL), k.reshape(-1, D_MODEL), v.reshape(-1, D_MODEL)]))
            ours.z.weight.copy_(z.reshape(-1, D_MODEL))
            b, a = theirs.in_proj_ba.weight.view(Hk, 2 * r, D_MODEL).split((r, r), dim=1)
            ours.b.weight.copy_(b.reshape(-1, D_MODEL))
            ours.a.weight.copy_(a.reshape(-1, D_MODEL))
        elif family == "qwen3_5":
            ours.qkv.weight.copy_(theirs.in_proj_qkv.weight)
            ours.z.weight.copy_(theirs.in_proj_z.weight)
            ours.b.weight.copy_(theirs.in_proj_b.weight)
            ours.a.weight.copy_(theirs.in_proj_a.weight)
        else:
            ours.qkv.weight.copy_(torch.cat([theirs.q_proj.weight, theirs.k_proj.weight, theirs.v_proj.weight]))
            ours.z.weight.copy_(theirs.g_proj.weight)
            ours.b.weight.copy_(theirs.b_proj.weight)
            ours.a.weight.copy_(theirs.a_proj.weight)
        ours.conv_weight.copy_(theirs.conv1d.weight.squeeze(1))
        ours.A_log.copy_(theirs.A_log)
        ours.dt_bias.copy_(theirs.dt_bias)
        norm = theirs.o_norm if family == "olmo_hybrid" else theirs.norm
        norm.weight.copy_(torch.randn_like(norm.weight))  # not the ones they start at, so the mapping shows
        ours.norm.weight.copy_(norm.weight)
        out = theirs.o_proj if family == "olmo_hybrid" else theirs.out_proj
        ours.out.weight.copy_(out.weight)


#: Each family's differences, as params.
FAMILY_PARAMS = {
    "qwen3_next": {},
    "qwen3_5": {},
    "olmo_hybrid": {"negative_eigenvalues": True, "norm_eps": 1e-5, "a_init_range": [0.0, 16.0],
                    "dt_init_range": [0.001, 0.1]},
}

SHAPES = {  # (key heads, value heads, key dim, value dim, conv kernel)
    "plain": (2, 2, 8, 8, 4),
    "gqa_dk_ne_dv_k3": (2, 4, 8, 6, 3),
}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("family", list(FAMILY_PARAMS))
def test_equals_transformers(family: str, shape: str) -> None:
    key_heads, value_heads, key_dim, value_dim, kernel = SHAPES[shape]
    torch.manual_seed(0)
    theirs = _hf_layer(family, _hf_config(family, key_heads=key_heads, value_heads=value_heads, key_dim=key_dim,
                                          value_dim=value_dim, kernel=kernel)).eval()
    params = GatedDeltaNetParams(n_heads=value_heads, n_key_heads=key_heads, key_head_dim=key_dim,
                                 value_head_dim=value_dim, conv_kernel=kernel, **FAMILY_PARAMS[family])
    ours = GatedDeltaNet(params, d_model=D_MODEL).eval()
    _copy_weights(family, theirs, ours)
    with torch.no_grad():
        # a bigger dt_bias spread and b scale than init, so decays and betas (up to 2 for OLMo) vary
        theirs.dt_bias.normal_()
        ours.dt_bias.copy_(theirs.dt_bias)
    x = torch.randn(2, 70, D_MODEL)  # more than one chunk of 64
    with torch.no_grad():
        want = theirs(x)
        got = ours(x, _context(x))
    torch.testing.assert_close(got, want, **TOL)
    assert ours.norm.eps == (1e-5 if family == "olmo_hybrid" else 1e-6)


def _context(x: Tensor, **kwargs: Any) -> ForwardContext:
    B, T, _ = x.shape
    positions = torch.arange(T).expand(B, T)
    return ForwardContext(positions=positions, positional=PositionalScheme(), plain_causal=True, **kwargs)


# -- the public facts, params and refusals ---------------------------------------------------


def test_public_facts_and_parameter_names() -> None:
    layer = GatedDeltaNet(GatedDeltaNetParams(n_heads=4, n_key_heads=2, key_head_dim=8, value_head_dim=6, conv_kernel=3,
                                              conv_bias=True), d_model=D_MODEL, layer_index=3)
    channels = 2 * 2 * 8 + 4 * 6
    assert (layer.n_heads, layer.n_kv_heads, layer.head_dim, layer.layer_index) == (4, 2, 6, 3)
    # A recurrence declares no window, no cache slots and no positions: the readers answer none for them.
    assert not hasattr(layer, "window") and not hasattr(layer, "cache_slots")
    assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False)
    assert layer.state_slots.shapes == {"conv": (channels, 2), "recurrent": (4, 8, 6)}
    shapes = {name: tuple(p.shape) for name, p in layer.named_parameters()}
    assert shapes == {"qkv.weight": (channels, D_MODEL), "z.weight": (24, D_MODEL), "b.weight": (4, D_MODEL),
                      "a.weight": (4, D_MODEL), "conv_weight": (channels, 3), "conv_bias": (channels,), "A_log": (4,),
                      "dt_bias": (4,), "norm.weight": (6,), "out.weight": (D_MODEL, 24)}
    assert "chunk 64" in layer.describe_kernel()


def test_initialisation_follows_the_family() -> None:
    torch.manual_seed(0)
    qwen = GatedDeltaNet(GatedDeltaNetParams(n_heads=64), d_model=64)
    assert torch.equal(qwen.dt_bias, torch.ones(64))
    assert (qwen.A_log.exp() >= 0.01 - 1e-6).all() and (qwen.A_log.exp() <= 16 + 1e-4).all()
    olmo = GatedDeltaNet(GatedDeltaNetParams(n_heads=64, dt_init_range=(0.001, 0.1)), d_model=64)
    dt = torch.nn.functional.softplus(olmo.dt_bias)
    assert (dt >= 0.001 - 1e-6).all() and (dt <= 0.1 + 1e-6).all()
    olmo.init_weights(std=0.02, residual_std=0.01)
    assert (torch.nn.functional.softplus(olmo.dt_bias) <= 0.1 + 1e-6).all()
    assert olmo.out.weight.std() < 0.015 and olmo.qkv.weight.std() > 0.015


@pytest.mark.parametrize(("params", "message"), [
    ({"n_heads": 4, "conv_kernel": 0}, "conv_kernel must be at least 2"),
    ({"n_heads": 4, "conv_kernel": 1}, "conv_kernel must be at least 2"),
    ({"n_heads": 4, "n_key_heads": 3}, r"n_key_heads \(3\) must divide n_heads \(4\)"),
    ({"n_heads": 4, "a_init_range": [2.0, 1.0]}, "a_init_range must be"),
    ({"n_heads": 4, "dt_init_range": [0.0, 0.1]}, "dt_init_range must be"),
])
def test_bad_params_are_one_clear_line(params: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GatedDeltaNetParams(**params)


def test_heads_that_do_not_divide_d_model_are_refused() -> None:
    with pytest.raises(ValueError, match=r"n_heads \(5\) must divide d_model \(32\) unless key_head_dim is given"):
        GatedDeltaNet(GatedDeltaNetParams(n_heads=5), d_model=D_MODEL)


def test_a_bad_spec_is_one_clear_line() -> None:
    spec = tiny_spec(block={"mixer": {"kind": "gated_deltanet", "n_heads": 4, "conv_kernel": 0}})
    with pytest.raises(SpecError) as caught:
        specformer.build(spec)
    text = str(caught.value)
    assert "conv_kernel must be at least 2" in text and "got 0" in text
    assert len([line for line in text.splitlines() if "conv_kernel" in line]) == 1


def test_summary_names_the_kernel() -> None:
    from specformer.model.summary import format_summary, summarize
    text = format_summary(summarize(_model()))
    assert "torch chunked (chunk 4)" in text and "(1 layer)" in text


# -- forms and states at the module level -------------------------------------------------------


class RecordingCache:
    """The recurrent-state protocol and nothing else: holds one layer's states, records the steps handed over."""

    def __init__(self, layer: GatedDeltaNet, batch: int, *, keep_steps: bool = False) -> None:
        self.keep_steps = keep_steps
        self.states = {name: torch.zeros(batch, *shape) for name, shape in layer.state_slots.tensors}
        self.steps: dict[str, Tensor] | None = None

    def read_state(self, layer_index: int, positions: Tensor) -> dict[str, Tensor]:
        return self.states

    def write_state(self, layer_index: int, states: dict[str, Tensor], *, steps: dict[str, Tensor] | None = None) -> None:
        assert (steps is not None) == self.keep_steps
        self.states = {name: value.clone() for name, value in states.items()}
        self.steps = steps


def _layer(**params: Any) -> GatedDeltaNet:
    torch.manual_seed(0)
    layer = GatedDeltaNet(GatedDeltaNetParams(**{"n_heads": 4, "n_key_heads": 2, "key_head_dim": 6, "value_head_dim": 5,
                                                 "conv_kernel": 3, "chunk": 4, **params}), d_model=D_MODEL)
    with torch.no_grad():
        layer.dt_bias.normal_()
        layer.conv_bias.normal_() if layer.conv_bias is not None else None
    return layer.eval()


def _cached(layer: GatedDeltaNet, cache: RecordingCache, x: Tensor, positions: Tensor) -> Tensor:
    return layer(x, ForwardContext(positions=positions, positional=PositionalScheme(), cache=cache))


@pytest.mark.parametrize("prefill", [3, 20], ids=["recurrent_prefill", "chunked_prefill"])
@torch.no_grad()
def test_cached_token_by_token_equals_the_whole_forward(prefill: int) -> None:
    layer = _layer(conv_bias=True, negative_eigenvalues=True)
    x = torch.randn(2, prefill + 5, D_MODEL)
    whole = layer(x, _context(x))
    cache = RecordingCache(layer, 2)
    outs = [_cached(layer, cache, x[:, :prefill], torch.arange(prefill).expand(2, -1))]
    for t in range(prefill, x.shape[1]):
        outs.append(_cached(layer, cache, x[:, t:t + 1], torch.full((2, 1), t)))
    torch.testing.assert_close(torch.cat(outs, 1), whole, **TOL)


@torch.no_grad()
def test_steps_are_the_state_after_each_token_and_padding_keeps_the_state() -> None:
    """keep_steps: the steps handed over equal the states a forward ending at that token leaves; padding's is the one before."""
    layer = _layer()
    x = torch.randn(1, 9, D_MODEL)
    start = RecordingCache(layer, 1)
    _cached(layer, start, x[:, :3], torch.arange(3)[None])
    kept = RecordingCache(layer, 1, keep_steps=True)
    kept.states = dict(start.states)
    positions = torch.tensor([[-1, -1, 3, 4, 5, 6]])  # two padding tokens open the row
    _cached(layer, kept, torch.cat((torch.randn(1, 2, D_MODEL), x[:, 3:7]), 1), positions)
    for name, value in start.states.items():
        assert torch.equal(kept.steps[name][:, 0], value) and torch.equal(kept.steps[name][:, 1], value)
    for t in range(4):
        upto = RecordingCache(layer, 1)
        upto.states = dict(start.states)
        _cached(layer, upto, x[:, 3:4 + t], torch.arange(3, 4 + t)[None])
        for name, value in upto.states.items():
            torch.testing.assert_close(kept.steps[name][:, 2 + t], value, **TOL)


@pytest.mark.parametrize("length", [6, 20], ids=["recurrent", "chunked"])
@torch.no_grad()
def test_padding_in_a_later_cached_forward_leaves_a_running_state_alone(length: int) -> None:
    """A row with fewer new tokens than the others (serving): its padding neither decays nor writes its state."""
    layer = _layer(conv_bias=True)
    x = torch.randn(1, 5 + length, D_MODEL)
    alone, padded = RecordingCache(layer, 1), RecordingCache(layer, 1)
    for cache in (alone, padded):
        _cached(layer, cache, x[:, :5], torch.arange(5)[None])
    want = _cached(layer, alone, x[:, 5 + 3:], torch.arange(5, 5 + length - 3)[None])
    positions = torch.cat((torch.full((1, 3), -1), torch.arange(5, 5 + length - 3)[None]), 1)
    got = _cached(layer, padded, torch.cat((torch.randn(1, 3, D_MODEL), x[:, 8:]), 1), positions)
    torch.testing.assert_close(got[:, 3:], want, **TOL)
    for name in alone.states:
        torch.testing.assert_close(padded.states[name], alone.states[name], **TOL)


@torch.no_grad()
def test_uncached_left_padding_is_kept_out_of_the_state() -> None:
    layer = _layer()
    x = torch.randn(1, 7, D_MODEL)
    alone = layer(x, _context(x))
    padded = torch.cat((torch.randn(1, 3, D_MODEL), x), 1)
    positions = torch.cat((torch.full((1, 3), -1), torch.arange(7)[None]), 1)
    got = layer(padded, ForwardContext(positions=positions, positional=PositionalScheme()))
    torch.testing.assert_close(got[:, 3:], alone, **TOL)


# -- through a whole model built from a spec ---------------------------------------------------------


def _model(**attention: Any) -> torch.nn.Module:
    mixer = {"kind": "gated_deltanet", "n_heads": 4, "n_key_heads": 2, "key_head_dim": 8, "value_head_dim": 6,
             "conv_kernel": 3, "chunk": 4, **attention}
    # layer 0 a Gated DeltaNet, layer 1 the spec's softmax attention (a hybrid, as Qwen3-Next is)
    spec = tiny_spec(block={"mixer": mixer}, layers=[{"select": "1", "mixer": {"kind": "attention", "n_heads": 4,
                                                                                          "n_kv_heads": 2}}])
    model = specformer.build(spec, seed=0).eval()
    with torch.no_grad():
        model.blocks[0].mixer.dt_bias.normal_()
    return model


def _logits(model: torch.nn.Module, ids: Tensor, **kwargs: Any) -> Tensor:
    out = model(ids, **kwargs)
    return out if isinstance(out, Tensor) else out.logits


@torch.no_grad()
def test_model_cached_generation_equals_the_uncached_forward() -> None:
    model = _model()
    ids = torch.randint(0, 97, (2, 14))
    whole = _logits(model, ids)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=32)
    got = [_logits(model, ids[:, :6], positions=torch.arange(6).expand(2, -1), cache=cache)]
    for t in range(6, 14):
        got.append(_logits(model, ids[:, t:t + 1], positions=torch.full((2, 1), t), cache=cache))
    torch.testing.assert_close(torch.cat(got, 1), whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("lengths", [(9, 5), (24, 17)], ids=["recurrent_prefill", "chunked_prefill"])
@torch.no_grad()
def test_model_left_padded_ragged_batch_equals_each_row_alone(lengths: tuple[int, int]) -> None:
    model = _model()
    long, short = lengths
    rows = [torch.randint(0, 97, (long,)), torch.randint(0, 97, (short,))]
    ids = torch.stack([rows[0], torch.cat((torch.zeros(long - short, dtype=torch.long), rows[1]))])
    positions = torch.stack([torch.arange(long), torch.arange(short - long, short).clamp(min=-1)])
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=32)
    prefill = _logits(model, ids, positions=positions, cache=cache)
    nxt = torch.randint(0, 97, (2, 1))
    step = _logits(model, nxt, positions=torch.tensor([[long], [short]]), cache=cache)
    for i, row in enumerate(rows):
        alone = _logits(model, torch.cat((row, nxt[i]))[None])
        torch.testing.assert_close(prefill[i, -len(row):], alone[0, :-1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(step[i, 0], alone[0, -1], rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_model_packed_documents_equal_each_document_alone() -> None:
    model = _model()
    docs = [torch.randint(0, 97, (n,)) for n in (5, 7, 4)]
    ids = torch.cat(docs)[None]
    document_ids = torch.cat([torch.full((len(d),), i) for i, d in enumerate(docs)])[None]
    positions = torch.cat([torch.arange(len(d)) for d in docs])[None]
    packed = _logits(model, ids, positions=positions, document_ids=document_ids)
    start = 0
    for doc in docs:
        torch.testing.assert_close(packed[0, start:start + len(doc)], _logits(model, doc[None])[0], rtol=1e-4, atol=1e-4)
        start += len(doc)


@torch.no_grad()
def test_model_reorder_for_beams_moves_the_states_with_the_rows() -> None:
    model = _model()
    ids = torch.randint(0, 97, (2, 6))
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=32)
    _logits(model, ids, positions=torch.arange(6).expand(2, -1), cache=cache)
    cache.reorder(torch.tensor([1, 1]))
    nxt = torch.randint(0, 97, (1, 1)).expand(2, 1)
    got = _logits(model, nxt, positions=torch.full((2, 1), 6), cache=cache)
    want = _logits(model, torch.cat((ids[1], nxt[0]))[None])[0, -1]
    torch.testing.assert_close(got[0, 0], want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got[1, 0], want, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_model_rollback_after_kept_steps_restores_exactly() -> None:
    """Speculative decoding: verify 4 drafts with keep_steps, keep 2, continue: as if only those 2 were ever written."""
    model = _model()
    ids = torch.randint(0, 97, (2, 12))
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=32, spare=4)
    _logits(model, ids[:, :6], positions=torch.arange(6).expand(2, -1), cache=cache)
    cache.keep_steps = True
    _logits(model, ids[:, 6:10], positions=torch.arange(6, 10).expand(2, -1), cache=cache)
    cache.rollback(8)
    got = _logits(model, ids[:, 8:12], positions=torch.arange(8, 12).expand(2, -1), cache=cache)
    want = _logits(model, ids)[:, 8:12]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
