"""Mamba-2's scan: the chunked and the token-by-token forms against the recurrence written out per token."""

from __future__ import annotations

import math

import pytest
import torch

from specformer_layers.mixers.ssd import ssd_chunked, ssd_recurrent


def reference(x, dt, A, B, C, D, state):
    """S_t = exp(dt A) S + dt x B^T; y_t = S C + D x, per row, token, head, one scalar at a time where it matters."""
    batch, length, heads, head_dim = x.shape
    per_group = heads // B.shape[2]
    s = state.clone().double()
    y = torch.zeros(batch, length, heads, head_dim, dtype=torch.float64)
    for b in range(batch):
        for t in range(length):
            for h in range(heads):
                g = h // per_group
                step = float(dt[b, t, h])
                s[b, h] = math.exp(step * float(A[h])) * s[b, h] + step * torch.outer(x[b, t, h].double(), B[b, t, g].double())
                y[b, t, h] = s[b, h] @ C[b, t, g].double() + float(D[h]) * x[b, t, h].double()
    return y.float(), s.float()


def inputs(batch=2, length=7, heads=4, head_dim=3, groups=2, size=5, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(batch, length, heads, head_dim)
    dt = torch.nn.functional.softplus(torch.randn(batch, length, heads))
    A = -torch.rand(heads) * 2 - 0.1
    B, C = torch.randn(batch, length, groups, size), torch.randn(batch, length, groups, size)
    D = torch.randn(heads)
    state = torch.randn(batch, heads, head_dim, size)
    return x, dt, A, B, C, D, state


@pytest.mark.parametrize(("length", "chunk", "groups"), [(8, 4, 1), (7, 3, 2), (7, 16, 4), (5, 1, 2)])
def test_chunked_and_recurrent_equal_the_recurrence_written_out(length: int, chunk: int, groups: int) -> None:
    x, dt, A, B, C, D, state = inputs(length=length, groups=groups)
    want_y, want_s = reference(x, dt, A, B, C, D, state)
    y, s = ssd_chunked(x, dt, A, B, C, chunk=chunk, D=D, state=state)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-5)
    y, s, steps = ssd_recurrent(x, dt, A, B, C, D=D, state=state, steps=True)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-5)
    assert steps.shape == (2, length, 4, 3, 5)
    torch.testing.assert_close(steps[:, -1], s)


def test_without_an_initial_state_it_starts_from_zeros() -> None:
    x, dt, A, B, C, D, state = inputs(length=6)
    want_y, want_s = reference(x, dt, A, B, C, D, torch.zeros_like(state))
    y, s = ssd_chunked(x, dt, A, B, C, chunk=4, D=D)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, want_s, rtol=1e-5, atol=1e-5)
    y, s, steps = ssd_recurrent(x, dt, A, B, C)  # no D: no skip
    assert steps is None
    torch.testing.assert_close(y, want_y - D[:, None] * x, rtol=1e-5, atol=1e-5)


def test_the_steps_are_the_states_of_every_prefix() -> None:
    x, dt, A, B, C, D, state = inputs(length=5)
    _, _, steps = ssd_recurrent(x, dt, A, B, C, D=D, state=state, steps=True)
    for t in range(5):
        _, s = ssd_chunked(x[:, :t + 1], dt[:, :t + 1], A, B[:, :t + 1], C[:, :t + 1], chunk=2, D=D, state=state)
        torch.testing.assert_close(steps[:, t], s, rtol=1e-5, atol=1e-5)


def test_a_token_with_dt_zero_leaves_the_state_unchanged() -> None:
    x, dt, A, B, C, D, state = inputs(length=6)
    dt[0, 2] = 0.0  # row 0's third token, and all of row 1, are "padding"
    dt[1] = 0.0
    _, _, steps = ssd_recurrent(x, dt, A, B, C, D=D, state=state, steps=True)
    torch.testing.assert_close(steps[0, 2], steps[0, 1])
    assert torch.equal(steps[1], state[None].expand(6, -1, -1, -1, -1)[:, 1])
    _, s = ssd_chunked(x, dt, A, B, C, chunk=4, D=D, state=state)
    torch.testing.assert_close(s[1], state[1])
    # Dropping the dt = 0 token from row 0 gives the same final state.
    keep = [0, 1, 3, 4, 5]
    _, alone = ssd_chunked(x[:1, keep], dt[:1, keep], A, B[:1, keep], C[:1, keep], chunk=4, D=D, state=state[:1])
    torch.testing.assert_close(s[:1], alone, rtol=1e-5, atol=1e-5)


def test_split_into_two_calls_equals_one() -> None:
    x, dt, A, B, C, D, state = inputs(length=9, groups=1)
    y, s = ssd_chunked(x, dt, A, B, C, chunk=4, D=D, state=state)
    y1, s1 = ssd_chunked(x[:, :5], dt[:, :5], A, B[:, :5], C[:, :5], chunk=4, D=D, state=state)
    y2, s2, _ = ssd_recurrent(x[:, 5:], dt[:, 5:], A, B[:, 5:], C[:, 5:], D=D, state=s1)
    torch.testing.assert_close(torch.cat((y1, y2), 1), y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s2, s, rtol=1e-5, atol=1e-5)


def test_shapes_that_do_not_fit_are_refused() -> None:
    x, dt, A, B, C, D, state = inputs(heads=4, groups=3)
    with pytest.raises(ValueError, match="groups of B and C"):
        ssd_chunked(x, dt, A, B, C, chunk=4)
    x, dt, A, B, C, D, state = inputs()
    with pytest.raises(ValueError, match="shapes do not fit"):
        ssd_recurrent(x, dt[:, :, :2], A, B, C)
