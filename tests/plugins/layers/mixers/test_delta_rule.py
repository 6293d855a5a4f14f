"""The gated delta rule: both forms against the recurrence written out with explicit outer products."""

from __future__ import annotations

import pytest
import torch

from specformer_layers.mixers.delta_rule import delta_rule_chunked, delta_rule_recurrent

TOL = {"rtol": 1e-5, "atol": 1e-5}


def reference(q, k, v, beta, log_decay, state, scale):
    """Per head and token: S <- (I - b k k^T) Diag(exp g) S + b k v^T, o = S^T (scale q); loops, no batching tricks."""
    batch, heads, length, key_dim = q.shape
    out = torch.zeros(*v.shape, dtype=torch.float64)
    final = torch.zeros(batch, heads, key_dim, v.shape[-1], dtype=torch.float64)
    steps = torch.zeros(batch, length, heads, key_dim, v.shape[-1], dtype=torch.float64)
    eye = torch.eye(key_dim, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            s = state[b, h].double().clone()
            for t in range(length):
                k_t, v_t, q_t = k[b, h, t].double(), v[b, h, t].double(), q[b, h, t].double()
                g = log_decay[b, h, t].double()
                decay = torch.diag(g.exp().expand(key_dim))  # one number per head, or one per channel
                strength = beta[b, h, t].double()
                s = (eye - strength * torch.outer(k_t, k_t)) @ decay @ s + strength * torch.outer(k_t, v_t)
                out[b, h, t] = s.T @ (scale * q_t)
                steps[b, t, h] = s
            final[b, h] = s
    return out, final, steps


def inputs(*, batch=2, heads=3, length=11, key_dim=5, value_dim=4, per_channel=False, seed=0):
    torch.manual_seed(seed)
    q = torch.randn(batch, heads, length, key_dim)
    k = torch.nn.functional.normalize(torch.randn(batch, heads, length, key_dim), dim=-1)
    v = torch.randn(batch, heads, length, value_dim)
    beta = torch.rand(batch, heads, length)
    decay_shape = (batch, heads, length, key_dim) if per_channel else (batch, heads, length)
    log_decay = -torch.rand(decay_shape) * 0.7
    state = torch.randn(batch, heads, key_dim, value_dim)
    return q, k, v, beta, log_decay, state


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
@pytest.mark.parametrize("with_state", [False, True], ids=["fresh", "initial_state"])
def test_recurrent_form_equals_the_reference(per_channel: bool, with_state: bool) -> None:
    q, k, v, beta, log_decay, state = inputs(per_channel=per_channel)
    start = state if with_state else torch.zeros_like(state)
    want, final, steps = reference(q, k, v, beta, log_decay, start, scale=5 ** -0.5)
    got = delta_rule_recurrent(q, k, v, beta, log_decay, state=state if with_state else None, steps=True)
    torch.testing.assert_close(got.out.double(), want, **TOL)
    torch.testing.assert_close(got.state.double(), final, **TOL)
    torch.testing.assert_close(got.steps.double(), steps, **TOL)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 16], ids=lambda c: f"chunk{c}")
def test_chunked_form_equals_the_reference(per_channel: bool, chunk: int) -> None:
    """Chunks that divide T (1 and 4 of 12, 11 of 11) and that don't (3 and 4 of 11, 11 of 12, 16 of either)."""
    for length in (11, 12):
        q, k, v, beta, log_decay, state = inputs(per_channel=per_channel, length=length, seed=length)
        want, final, _ = reference(q, k, v, beta, log_decay, state, scale=0.3)
        got = delta_rule_chunked(q, k, v, beta, log_decay, state=state, scale=0.3, chunk=chunk)
        torch.testing.assert_close(got.out.double(), want, **TOL)
        torch.testing.assert_close(got.state.double(), final, **TOL)
        assert got.steps is None


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_chunked_equals_recurrent_with_strong_decay_and_beta_up_to_two(per_channel: bool) -> None:
    """Decays far below zero (exp underflows) and negative eigenvalues (beta in [0, 2], OLMo Hybrid) stay finite and agree."""
    q, k, v, beta, log_decay, state = inputs(per_channel=per_channel, length=40, seed=3)
    log_decay = log_decay * 40  # down to -28 per token
    beta = beta * 2
    chunked = delta_rule_chunked(q, k, v, beta, log_decay, state=state, chunk=16)
    recurrent = delta_rule_recurrent(q, k, v, beta, log_decay, state=state)
    assert torch.isfinite(chunked.out).all()
    torch.testing.assert_close(chunked.out, recurrent.out, **TOL)
    torch.testing.assert_close(chunked.state, recurrent.state, **TOL)


def test_a_state_passed_between_calls_continues_the_sequence() -> None:
    q, k, v, beta, log_decay, state = inputs(length=12, per_channel=True)
    whole = delta_rule_chunked(q, k, v, beta, log_decay, state=state, chunk=4)
    first = delta_rule_chunked(q[:, :, :7], k[:, :, :7], v[:, :, :7], beta[:, :, :7], log_decay[:, :, :7],
                               state=state, chunk=4)
    rest = delta_rule_recurrent(q[:, :, 7:], k[:, :, 7:], v[:, :, 7:], beta[:, :, 7:], log_decay[:, :, 7:],
                                state=first.state)
    torch.testing.assert_close(torch.cat((first.out, rest.out), dim=2), whole.out, **TOL)
    torch.testing.assert_close(rest.state, whole.state, **TOL)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_a_token_with_no_write_and_no_decay_leaves_the_state_unchanged(per_channel: bool) -> None:
    """Padding: beta = 0 and log_decay = 0 change nothing, whatever its query, key and value."""
    q, k, v, beta, log_decay, state = inputs(per_channel=per_channel, length=6)
    beta[:, :, :3] = 0
    log_decay[:, :, :3] = 0
    got = delta_rule_recurrent(q, k, v, beta, log_decay, state=state, steps=True)
    for t in range(3):
        assert torch.equal(got.steps[:, t], state)
    alone = delta_rule_recurrent(q[:, :, 3:], k[:, :, 3:], v[:, :, 3:], beta[:, :, 3:], log_decay[:, :, 3:], state=state)
    torch.testing.assert_close(got.out[:, :, 3:], alone.out, **TOL)
    chunked = delta_rule_chunked(q, k, v, beta, log_decay, state=state, chunk=4)
    torch.testing.assert_close(chunked.out[:, :, 3:], alone.out, **TOL)
    torch.testing.assert_close(chunked.state, alone.state, **TOL)
    only_padding = delta_rule_chunked(q[:, :, :3], k[:, :, :3], v[:, :, :3], beta[:, :, :3], log_decay[:, :, :3],
                                      state=state, chunk=2)
    torch.testing.assert_close(only_padding.state, state, rtol=0, atol=1e-6)


def test_low_precision_inputs_come_back_in_their_dtype_computed_in_float32() -> None:
    q, k, v, beta, log_decay, state = inputs(length=9)
    half = [x.bfloat16() for x in (q, k, v, beta, log_decay, state)]
    for form in (delta_rule_recurrent, delta_rule_chunked):
        got = form(*half[:5], state=half[5])
        assert got.out.dtype == torch.bfloat16 and got.state.dtype == torch.bfloat16
        want = form(*[x.float() for x in half[:5]], state=half[5].float())
        torch.testing.assert_close(got.out, want.out.bfloat16())


def test_unfit_shapes_are_refused_in_one_line() -> None:
    q, k, v, beta, log_decay, state = inputs()
    with pytest.raises(ValueError, match=r"log_decay must be \(B, H, T\)"):
        delta_rule_chunked(q, k, v, beta, log_decay[..., None].expand(-1, -1, -1, 2))
    with pytest.raises(ValueError, match="state must be"):
        delta_rule_recurrent(q, k, v, beta, log_decay, state=state.transpose(-1, -2))
    with pytest.raises(ValueError, match="chunk must be"):
        delta_rule_chunked(q, k, v, beta, log_decay, chunk=0)


@pytest.mark.parametrize("per_channel", [False, True], ids=["qwen3_next", "kimi_linear"])
def test_matches_transformers_torch_paths(per_channel: bool) -> None:
    """The same recurrence as transformers' Qwen3-Next (per-head decay) and Kimi Linear (per-channel) torch paths."""
    if per_channel:
        from transformers.models.kimi_linear.modeling_kimi_linear import chunk_kimi_delta_attention as theirs
    else:
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule as theirs
    q, k, v, beta, log_decay, state = inputs(per_channel=per_channel, length=13)
    layout = [x.transpose(1, 2) for x in (q, k, v, beta, log_decay)]  # theirs: (B, T, H, ...)
    out, final = theirs(*layout[:3], g=layout[4], beta=layout[3], chunk_size=4, initial_state=state,
                        output_final_state=True)
    got = delta_rule_chunked(q, k, v, beta, log_decay, state=state, chunk=8)
    torch.testing.assert_close(got.out.transpose(1, 2), out, **TOL)
    torch.testing.assert_close(got.state, final, **TOL)
