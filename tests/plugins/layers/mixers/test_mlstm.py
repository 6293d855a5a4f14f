"""The mlstm mixer (xLSTM's matrix memory): the recurrence written out, the chunked form and the token loop
against it, transformers' xLSTMLayer, and exact through a model with a cache.

Through a whole model: a cached token-by-token decode and a prefill by chunks equal the uncached
forward, a left-padded ragged batch equals each row alone, packed documents equal each document
alone, beam reordering and speculative rollback (``keep_steps``) restore states exactly, and the
serve engine batches requests as each alone.
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
from specformer_layers.mixers.mlstm import MemoryState, MLSTM, mlstm_chunked, mlstm_recurrent
from specformer_layers.mixers.mlstm_params import MLSTMParams

from tests.fixtures.tiny import tiny_spec
from .through_the_cache import (
    assert_a_left_padded_ragged_batch_equals_each_row_alone,
    assert_cached_decode_equals_the_uncached_forward,
    assert_packed_documents_equal_each_document_alone,
    assert_reorder_and_rollback_restore_the_states_exactly,
)

pytestmark = pytest.mark.usefixtures("one_thread")

MIXER = {"kind": "mlstm", "n_heads": 4, "chunk": 4}


def _layer(*, heads: int = 3, qk: int = 6, v: int = 9, d_model: int = 12, chunk: int = 4, bias: bool = True,
           cap: float | None = 15.0, gate_shift: float = 0.0) -> MLSTM:
    layer = MLSTM(MLSTMParams(n_heads=heads, qk_dim=qk, v_dim=v, chunk=chunk, bias=bias, gate_soft_cap=cap),
                  d_model=d_model)
    torch.manual_seed(3)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) * 0.4)
        layer.input_gate.bias += gate_shift
        layer.forget_gate.weight *= 4  # forget gates from near 0 to near 1
    return layer


def _naive(layer: MLSTM, x: torch.Tensor) -> torch.Tensor:
    """The mLSTM layer written out token by token, per row and head, in float64 (Beck et al. 2024, eqs. 19-27).

    m_t = max(log f_t + m_{t-1}, log i_t); i'_t = exp(log i_t - m_t); f'_t = exp(log f_t + m_{t-1} - m_t);
    C_t = f'_t C_{t-1} + i'_t k_t v_tᵀ; n_t = f'_t n_{t-1} + i'_t k_t;
    h_t = (C_tᵀ q_t) / (max(|n_tᵀ q_t|, exp(-m_t)) + eps), q scaled by 1/sqrt(d_k);
    log i = cap tanh(ĩ / cap), log f = log sigmoid(cap tanh(f̃ / cap)) (xLSTM-7B's soft-capped gates);
    then per head a layer norm, the affine over all channels, times sigmoid(o), and the out projection.
    """
    d = {name: p.detach().double() for name, p in layer.named_parameters()}
    cap = layer.gate_soft_cap
    capped = (lambda z: z) if cap is None else (lambda z: cap * math.tanh(z / cap))
    H, dk, dv = layer.n_heads, layer.head_dim, layer.v_head_dim
    x = x.double()

    def linear(name: str, xt: torch.Tensor) -> torch.Tensor:
        out = d[f"{name}.weight"] @ xt
        return out + d[f"{name}.bias"] if f"{name}.bias" in d else out

    outs = []
    for b in range(x.shape[0]):
        C = [torch.zeros(dk, dv, dtype=torch.float64) for _ in range(H)]
        n = [torch.zeros(dk, dtype=torch.float64) for _ in range(H)]
        m = [0.0] * H
        rows = []
        for t in range(x.shape[1]):
            xt = x[b, t]
            q, k, v = linear("q", xt), linear("k", xt), linear("v", xt)
            i_pre, f_pre = linear("input_gate", xt), linear("forget_gate", xt)
            heads = []
            for h in range(H):
                qh, kh, vh = q[h * dk:(h + 1) * dk] / math.sqrt(dk), k[h * dk:(h + 1) * dk], v[h * dv:(h + 1) * dv]
                log_i = capped(float(i_pre[h]))
                log_f = -math.log1p(math.exp(-capped(float(f_pre[h]))))  # log sigmoid
                m_new = max(log_f + m[h], log_i)
                i_act, f_act = math.exp(log_i - m_new), math.exp(log_f + m[h] - m_new)
                C[h] = f_act * C[h] + i_act * torch.outer(kh, vh)
                n[h] = f_act * n[h] + i_act * kh
                m[h] = m_new
                hh = (C[h].T @ qh) / (max(abs(float(n[h] @ qh)), math.exp(-m_new)) + layer.eps)
                heads.append((hh - hh.mean()) / torch.sqrt(hh.var(unbiased=False) + layer.norm_eps))
            o = torch.cat(heads) * d["norm_weight"] + d.get("norm_bias", 0.0)
            rows.append(linear("out", torch.sigmoid(linear("out_gate", xt)) * o))
        outs.append(torch.stack(rows))
    return torch.stack(outs).float()


@pytest.mark.parametrize(("length", "chunk", "bias", "cap", "shift"), [
    (11, 4, True, 15.0, 0.0), (8, 4, False, 15.0, 0.0), (1, 3, True, 15.0, 0.0), (13, 5, True, None, 0.0),
    (9, 4, False, None, 100.0),  # exp(100) overflows float32: only the stabiliser keeps this finite
    (10, 3, True, 2.0, 5.0),
])
def test_equals_the_recurrence_written_out(length: int, chunk: int, bias: bool, cap: float | None, shift: float) -> None:
    layer = _layer(chunk=chunk, bias=bias, cap=cap, gate_shift=shift)
    x = torch.randn(2, length, 12)
    with torch.no_grad():
        want = _naive(layer, x)
        by_chunks, token_loop = layer.run(x).out, layer.run(x, steps=True).out
    assert torch.isfinite(by_chunks).all()
    torch.testing.assert_close(by_chunks, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(token_loop, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("length", "chunk"), [(10, 4), (7, 7), (9, 16), (12, 1), (13, 5)])
def test_the_chunked_form_equals_the_token_loop_from_any_state_and_with_padding(length: int, chunk: int) -> None:
    torch.manual_seed(length)
    B, H, dk, dv = 3, 2, 4, 5
    q, k = torch.randn(B, H, length, dk), torch.randn(B, H, length, dk)
    v = torch.randn(B, H, length, dv)
    i = torch.randn(B, H, length) * 4
    log_f = torch.nn.functional.logsigmoid(torch.randn(B, H, length) * 3)
    i[1, :, :3], log_f[1, :, :3] = float("-inf"), 0.0  # padding: writes nothing, forgets nothing
    state = MemoryState(torch.randn(B, H, dk, dv), torch.randn(B, H, dk), torch.randn(B, H) * 3)
    loop = mlstm_recurrent(q, k, v, i, log_f, state=state, eps=1e-6, steps=True)
    chunks = mlstm_chunked(q, k, v, i, log_f, state=state, eps=1e-6, chunk=chunk)
    torch.testing.assert_close(chunks.out, loop.out, rtol=1e-5, atol=1e-5)
    for got, want in zip((chunks.state.memory, chunks.state.normaliser, chunks.state.stabiliser),
                         (loop.state.memory, loop.state.normaliser, loop.state.stabiliser)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(loop.steps.memory[:, -1], loop.state.memory)
    # Row 1's padding left the state as it was.
    torch.testing.assert_close(loop.steps.memory[1, 2], state.memory[1])
    torch.testing.assert_close(loop.steps.stabiliser[1, 2], state.stabiliser[1])


@pytest.mark.parametrize(("heads", "hidden", "qk_factor", "length"), [(2, 128, 0.5, 7), (1, 64, 1.0, 70)])
def test_equals_transformers_xlstm_layer(heads: int, hidden: int, qk_factor: float, length: int) -> None:
    from transformers import xLSTMConfig
    from transformers.models.xlstm.modeling_xlstm import xLSTMLayer

    config = xLSTMConfig(hidden_size=hidden, num_heads=heads, qk_dim_factor=qk_factor, chunk_size=16,
                         gate_soft_cap=4.0, norm_eps=1e-5, eps=1e-6)
    torch.manual_seed(0)
    hf = xLSTMLayer(config).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.2)
    qk = int(hidden * qk_factor)
    ours = MLSTM(MLSTMParams(n_heads=heads, qk_dim=qk, v_dim=hidden, chunk=8, gate_soft_cap=4.0, norm_eps=1e-5),
                 d_model=hidden)
    pairs = {"q": "q", "k": "k", "v": "v", "out_gate": "ogate_preact", "input_gate": "igate_preact",
             "forget_gate": "fgate_preact", "out": "out_proj"}
    with torch.no_grad():
        for mine, theirs in pairs.items():
            getattr(ours, mine).load_state_dict(getattr(hf, theirs).state_dict())
        ours.norm_weight.copy_(hf.multihead_norm.weight)
        x = torch.randn(2, length, hidden)
        want, _ = hf(x)
        torch.testing.assert_close(ours.run(x).out, want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(ours.run(x, steps=True).out, want, rtol=1e-4, atol=1e-5)


# -- through a model ------------------------------------------------------------------------------


def _model(mixed: bool = False, **mixer):
    spec = tiny_spec(block={"mixer": {**MIXER, **mixer}}, positional={"kind": "none"}, n_layers=3)
    if mixed:
        spec["model"]["positional"] = {"kind": "rope"}
        spec["model"]["layers"] = [{"select": "1", "mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2}}]
    model = specformer.build(spec, seed=0).eval()
    with torch.no_grad():  # gates that write and forget (the initial ones barely write)
        for block in model.blocks:
            if isinstance(block.mixer, MLSTM):
                for gate in (block.mixer.input_gate, block.mixer.forget_gate):
                    gate.weight.normal_(std=0.5)
                    gate.bias.normal_(std=1.0)
    return model


@pytest.mark.parametrize("mixed", [False, True])
def test_cached_decode_equals_the_uncached_forward(mixed: bool) -> None:
    assert_cached_decode_equals_the_uncached_forward(_model(mixed))


@pytest.mark.parametrize("mixed", [False, True])
def test_a_left_padded_ragged_batch_equals_each_row_alone(mixed: bool) -> None:
    """Through the cache and recomputed without one: padding neither writes to nor forgets a state."""
    assert_a_left_padded_ragged_batch_equals_each_row_alone(_model(mixed))


def test_packed_documents_equal_each_document_alone() -> None:
    assert_packed_documents_equal_each_document_alone(_model())


def test_reorder_and_rollback_restore_the_states_exactly() -> None:
    assert_reorder_and_rollback_restore_the_states_exactly(_model(mixed=True))


def test_public_facts() -> None:
    layer = _model().blocks[0].mixer
    assert heads_of(layer) is not None and layer.n_heads == 4 and layer.head_dim == 4 and layer.v_head_dim == 8
    assert not any(hasattr(layer, fact) for fact in ("window", "cache_slots", "uses_positions"))
    assert (reach_of(layer), cache_slots_of(layer), uses_positions(layer)) == (None, None, False)
    assert layer.state_slots.shapes == {"memory": (4, 4, 8), "normaliser": (4, 4), "stabiliser": (4,)}
    assert "chunk 4" in layer.describe_kernel()
    summary = specformer.summarize(tiny_spec(block={"mixer": MIXER}, positional={"kind": "none"}, n_layers=3))
    assert summary.total == sum(p.numel() for p in _model().parameters())


def test_initial_gates_are_xlstms() -> None:
    layer = specformer.build(tiny_spec(block={"mixer": MIXER}, positional={"kind": "none"}), seed=0).blocks[0].mixer
    assert torch.equal(layer.input_gate.bias, torch.full((4,), -10.0))
    assert torch.equal(layer.forget_gate.bias, torch.linspace(3.0, 6.0, 4))
    assert not layer.input_gate.weight.any() and not layer.forget_gate.weight.any()


@pytest.mark.parametrize(("change", "message", "where"), [
    ({"n_heads": 0}, "greater than 0", "model.block.mixer.n_heads: "),
    ({"chunk": 0}, "greater than 0", "model.block.mixer.chunk: "),
    ({"qk_dim": 6}, r"n_heads \(4\) must divide qk_dim \(6\)", "model.block.mixer: "),
])
def test_bad_params_are_one_clear_line(change: dict, message: str, where: str) -> None:
    with pytest.raises(ValidationError, match=message):
        MLSTMParams(**{**{k: v for k, v in MIXER.items() if k != "kind"}, **change})
    with pytest.raises(Exception, match=message) as caught:
        specformer.build(tiny_spec(block={"mixer": {**MIXER, **change}}), seed=0)
    lines = [line for line in str(caught.value).splitlines() if re.search(message, line)]
    assert len(lines) == 1 and lines[0].strip().startswith(where)


def test_heads_that_do_not_divide_the_default_widths_need_them_given() -> None:
    with pytest.raises(Exception, match=r"n_heads \(5\) must divide qk_dim \(16 for d_model 32\); give qk_dim"):
        specformer.build(tiny_spec(block={"mixer": {"kind": "mlstm", "n_heads": 5}}, positional={"kind": "none"}),
                         seed=0)


def test_served_requests_batched_give_what_each_gives_alone() -> None:
    """The serve engine's paged cache keeps one state per request: more requests than the batch holds."""
    from tests.plugins.serve.test_engine import assert_greedy_batched_equals_alone

    model = _model(mixed=True)
    prompts = [[5, 9, 2, 7, 1], [3], [8, 8, 1, 4, 4, 6, 2], [11, 12]]
    lengths = [4, 6, 3, 5]
    assert_greedy_batched_equals_alone(model, prompts, lengths, max_batch=2, num_blocks=32)
