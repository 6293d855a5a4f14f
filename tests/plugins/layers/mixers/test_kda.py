"""Kimi Delta Attention: transformers' KimiLinearDeltaAttention on the same weights, and the mixer rules in a model.

The module is compared with transformers' torch path (its chunked form, and its token-by-token
form through its cache). Through a whole model (one softmax attention layer beside KDA layers)
the cache must change nothing: cached decoding, left-padded ragged rows, packed documents, beam
reordering and speculative rollback each give what the plain forward of the same tokens gives.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.model.attention import HeadSizes, cache_slots_of, heads_of, reach_of
from specformer.model.state import uses_positions
from specformer.model.context import ForwardContext
from specformer_generate import StaticKVCache, generate
from specformer_layers.mixers.kda import KimiDeltaAttention
from specformer_layers.mixers.kda_params import KimiDeltaAttentionParams

from fixtures.tiny import tiny_spec

D_MODEL = 32
#: Through the model in float64: the chunked and token-by-token forms, cached or not, agree to rounding.
TOL = 1e-9


def hf_layer(*, heads: int, head_dim: int, kernel: int, seed: int = 0) -> Any:
    """transformers' KimiLinearDeltaAttention with every tensor random (norm weight included)."""
    from transformers import KimiLinearConfig
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    config = KimiLinearConfig(hidden_size=D_MODEL, num_hidden_layers=2, rms_norm_eps=1e-5,
                              linear_attn_config={"head_dim": head_dim, "num_heads": heads,
                                                  "short_conv_kernel_size": kernel})
    torch.manual_seed(seed)
    layer = KimiLinearDeltaAttention(config, 0)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return layer.eval()


def ours_from(hf: Any, *, chunk: int = 64) -> KimiDeltaAttention:
    heads, head_dim = hf.num_heads, hf.head_dim
    ours = KimiDeltaAttention(KimiDeltaAttentionParams(n_heads=heads, head_dim=head_dim, conv_kernel=hf.conv_kernel_size,
                                                       norm_eps=1e-5, chunk=chunk), d_model=D_MODEL)
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        ours.conv_weight.copy_(hf.conv1d.weight.squeeze(1))
        ours.f_a.weight.copy_(hf.forget_gate.f_a_proj.weight)
        ours.f_b.weight.copy_(hf.forget_gate.f_b_proj.weight)
        ours.A_log.copy_(hf.forget_gate.A_log.reshape(-1))
        ours.dt_bias.copy_(hf.forget_gate.dt_bias)
        for mine, theirs in ((ours.b, hf.b_proj), (ours.g_a, hf.g_a_proj), (ours.g_b, hf.g_b_proj), (ours.out, hf.o_proj)):
            mine.weight.copy_(theirs.weight)
        ours.norm.weight.copy_(hf.o_norm.weight)
    return ours.eval()


def plain(batch: int, length: int) -> ForwardContext:
    return ForwardContext(positions=torch.arange(length).expand(batch, length), positional=None)


@pytest.mark.parametrize(("heads", "head_dim", "kernel", "chunk"), [(3, 8, 3, 4), (2, 12, 4, 5), (4, 8, 4, 64)])
def test_matches_transformers_kimi_delta_attention(heads: int, head_dim: int, kernel: int, chunk: int) -> None:
    hf = hf_layer(heads=heads, head_dim=head_dim, kernel=kernel)
    ours = ours_from(hf, chunk=chunk)
    x = torch.randn(2, 13, D_MODEL, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        reference = hf(x)
        got = ours(x, plain(2, 13))
    assert reference.abs().max() > 0.1
    torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)


def test_decoding_through_transformers_cache_matches_ours() -> None:
    """A prompt, then tokens one at a time: transformers' recurrent path and its conv update against our cache."""
    from transformers import DynamicCache

    hf = hf_layer(heads=2, head_dim=8, kernel=4)
    ours = ours_from(hf, chunk=4)
    x = torch.randn(1, 9, D_MODEL, generator=torch.Generator().manual_seed(2))
    hf_cache = DynamicCache(config=_hf_config(hf))
    cache = StaticKVCache(layers=(), states=[_state_shape(ours)], batch_size=1, capacity=9)
    with torch.no_grad():
        for start, stop in ((0, 6), (6, 7), (7, 8), (8, 9)):
            reference = hf(x[:, start:stop], cache=hf_cache)
            ctx = ForwardContext(positions=torch.arange(start, stop)[None], positional=None, cache=cache)
            torch.testing.assert_close(ours(x[:, start:stop], ctx), reference, rtol=1e-5, atol=1e-5)


def _hf_config(hf: Any) -> Any:
    from transformers import KimiLinearConfig

    return KimiLinearConfig(hidden_size=D_MODEL, num_hidden_layers=1, layer_types=["linear_attention"],
                            linear_attn_config={"head_dim": hf.head_dim, "num_heads": hf.num_heads,
                                                "short_conv_kernel_size": hf.conv_kernel_size})


def _state_shape(layer: KimiDeltaAttention) -> Any:
    from specformer_generate.cache import StateShape

    return StateShape.of(layer)


def test_public_facts() -> None:
    layer = KimiDeltaAttention(KimiDeltaAttentionParams(n_heads=2, head_dim=8, value_head_dim=6, conv_kernel=3),
                               d_model=D_MODEL, layer_index=1)
    channels = 2 * 2 * 8 + 2 * 6
    assert layer.state_slots.tensors == (("conv", (channels, 2)), ("recurrent", (2, 8, 6)))
    assert not hasattr(layer, "window") and not hasattr(layer, "cache_slots") and not hasattr(layer, "n_kv_heads")
    assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False)
    assert (heads_of(layer), layer.layer_index) == (HeadSizes(n_heads=2, n_kv_heads=2, head_dim=8), 1)
    assert layer.qkv.weight.shape == (channels, D_MODEL) and layer.conv_weight.shape == (channels, 3)
    assert layer.out.weight.shape == (D_MODEL, 12) and layer.norm.weight.shape == (6,)
    assert "chunk 64" in layer.describe_kernel()


def test_chunked_and_token_by_token_forms_agree() -> None:
    """A cached forward of few tokens runs the recurrence; the same tokens uncached run the chunked form."""
    layer = KimiDeltaAttention(KimiDeltaAttentionParams(n_heads=2, head_dim=8, value_head_dim=12, chunk=3),
                               d_model=D_MODEL).double().eval()
    x = torch.randn(2, 10, D_MODEL, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    cache = StaticKVCache(layers=(), states=[_state_shape(layer)], batch_size=2, capacity=10, dtype=torch.float64)
    with torch.no_grad():
        chunked = layer(x, plain(2, 10))
        stepped = torch.cat([layer(x[:, t : t + 1], ForwardContext(positions=torch.full((2, 1), t), positional=None,
                                                                  cache=cache)) for t in range(10)], dim=1)
    torch.testing.assert_close(stepped, chunked, rtol=TOL, atol=TOL)


# -- through a whole model -------------------------------------------------------------------------


def kda_spec(**kda: Any) -> dict[str, Any]:
    """Three layers: KDA, softmax attention, KDA; chunks of 4 so that prefills span several."""
    attention = {"kind": "kda", "n_heads": 2, "head_dim": 8, "value_head_dim": 12, "conv_kernel": 3, "chunk": 4, **kda}
    return tiny_spec(n_layers=3, context_length=64, block={"mixer": attention},
                     layers=[{"select": 1, "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}}])


@pytest.fixture(scope="module")
def model() -> Any:
    return specformer.build(kda_spec(), seed=0).double().eval()


def ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_the_model_holds_kda_and_attention_layers(model: Any) -> None:
    kinds = [type(block.mixer).__name__ for block in model.blocks]
    assert kinds == ["KimiDeltaAttention", "CausalSelfAttention", "KimiDeltaAttention"]


def test_cached_decoding_equals_the_plain_forward(model: Any) -> None:
    tokens = ids(2, 43)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=43)
    positions = torch.arange(43).expand(2, 43)
    out, start = [], 0
    with torch.no_grad():
        for size in (20, 1, 1, 2, 19):  # chunked prefill, steps, then a chunked forward from a state
            out.append(model(tokens[:, start : start + size], positions=positions[:, start : start + size], cache=cache))
            start += size
        torch.testing.assert_close(torch.cat(out, dim=1), model(tokens), rtol=TOL, atol=TOL)


def test_left_padded_rows_equal_each_row_alone(model: Any) -> None:
    lengths, width = (9, 4, 1), 9
    tokens = ids(3, width, seed=4)
    positions = torch.stack([torch.arange(width) - (width - n) for n in lengths])  # negative: padding
    following = ids(3, 2, seed=5)
    cache = StaticKVCache.for_model(model, batch_size=3, capacity=width + 2)
    with torch.no_grad():
        prefill = model(tokens, positions=positions, cache=cache)
        step = model(following, positions=positions[:, -1:] + torch.arange(1, 3), cache=cache)
        for row, n in enumerate(lengths):
            alone = model(torch.cat((tokens[row : row + 1, width - n :], following[row : row + 1]), dim=1))
            torch.testing.assert_close(prefill[row, width - n :], alone[0, :n], rtol=TOL, atol=TOL)
            torch.testing.assert_close(step[row], alone[0, n:], rtol=TOL, atol=TOL)


def test_packed_documents_equal_each_document_alone(model: Any) -> None:
    sizes = ((5, 11, 2), (18,))
    tokens, document_ids, positions = ids(2, 18, seed=6), torch.zeros(2, 18, dtype=torch.long), torch.zeros(2, 18, dtype=torch.long)
    for row, row_sizes in enumerate(sizes):
        start = 0
        for doc, size in enumerate(row_sizes):
            document_ids[row, start : start + size] = doc
            positions[row, start : start + size] = torch.arange(size)
            start += size
    with torch.no_grad():
        packed = model(tokens, positions=positions, document_ids=document_ids)
        for row, row_sizes in enumerate(sizes):
            start = 0
            for size in row_sizes:
                alone = model(tokens[row : row + 1, start : start + size])
                torch.testing.assert_close(packed[row : row + 1, start : start + size], alone, rtol=TOL, atol=TOL)
                start += size


def test_beam_reorder_moves_the_states_with_the_rows(model: Any) -> None:
    tokens, following = ids(3, 6, seed=7), ids(3, 1, seed=8)
    cache = StaticKVCache.for_model(model, batch_size=3, capacity=7)
    rows = torch.tensor([2, 0, 0])
    with torch.no_grad():
        model(tokens, positions=torch.arange(6).expand(3, 6), cache=cache)
        cache.reorder(rows)
        step = model(following, positions=torch.full((3, 1), 6), cache=cache)
        expected = model(torch.cat((tokens[rows], following), dim=1))[:, -1:]
    torch.testing.assert_close(step, expected, rtol=TOL, atol=TOL)


def test_speculative_rollback_returns_to_the_state_after_the_kept_drafts(model: Any) -> None:
    tokens = ids(2, 12, seed=9)
    cache = StaticKVCache.for_model(model, batch_size=2, capacity=12, spare=4)
    positions = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        model(tokens[:, :6], positions=positions[:, :6], cache=cache)
        cache.keep_steps = True
        model(tokens[:, 6:10], positions=positions[:, 6:10], cache=cache)  # a token and three drafts
        cache.rollback(8)  # two kept
        after = model(tokens[:, 8:10], positions=positions[:, 8:10], cache=cache)
        torch.testing.assert_close(after, model(tokens[:, :10])[:, 8:], rtol=TOL, atol=TOL)


PROMPTS = [[5, 9, 2, 7, 1, 3, 8], [4, 4, 1], [7]]


@pytest.mark.parametrize("how", [{}, {"draft": "ngram", "draft_tokens": 3}], ids=["greedy", "speculative"])
def test_generation_equals_recompute(model: Any, how: dict[str, Any]) -> None:
    assert generate(model, PROMPTS, max_new_tokens=5, **how) == generate(model, PROMPTS, max_new_tokens=5, use_cache=False)


def test_beam_search_equals_recompute(model: Any) -> None:
    prompt = ids(1, 5, seed=10)
    assert torch.equal(generate(model, prompt, max_new_tokens=4, num_beams=3),
                       generate(model, prompt, max_new_tokens=4, num_beams=3, use_cache=False))


@pytest.mark.parametrize(("change", "where", "says"), [
    ({"n_heads": 0}, "model.block.mixer.n_heads", "greater than 0"),
    ({"conv_kernel": 1}, "model.block.mixer.conv_kernel", "conv_kernel must be at least 2"),
    ({"chunk": 0}, "model.block.mixer.chunk", "greater than 0"),
    ({"gate": 3}, "model.block.mixer.gate", "unknown field; did you mean 'gate_rank'?"),
])
def test_bad_params_are_one_clear_line(change: dict[str, Any], where: str, says: str) -> None:
    with pytest.raises(SpecError) as info:
        specformer.load_spec(kda_spec(**change))
    assert len(info.value.problems) == 1
    problem = info.value.problems[0]
    assert problem.path == where and says in problem.message, str(problem)


def test_heads_that_do_not_divide_d_model_need_a_head_dim() -> None:
    spec = kda_spec(n_heads=5, head_dim=None, value_head_dim=None)
    with pytest.raises(SpecError) as info:
        specformer.build(spec)
    assert [(p.path, p.message) for p in info.value.problems] == [
        ("model.block.mixer", "n_heads (5) must divide d_model (32), or set head_dim")]
