"""Mamba-1's selective scan: the chunked and the token-by-token forms against the recurrence written out."""

from __future__ import annotations

import math

import pytest
import torch

from specformer_layers.mixers.selective_scan import selective_scan_chunked, selective_scan_recurrent


def reference(x, dt, A, B, C, D, state):
    """The Mamba paper's equations one scalar at a time: h_t = exp(dt A) h_{t-1} + dt B_t x_t; y_t = C_t h_t + D x_t."""
    batch, length, channels = x.shape
    size = A.shape[1]
    h = state.clone().double()
    y = torch.zeros(batch, length, channels, dtype=torch.float64)
    for b in range(batch):
        for t in range(length):
            for d in range(channels):
                step, u = float(dt[b, t, d]), float(x[b, t, d])
                total = 0.0
                for n in range(size):
                    h[b, d, n] = math.exp(step * float(A[d, n])) * float(h[b, d, n]) + step * float(B[b, t, n]) * u
                    total += float(C[b, t, n]) * float(h[b, d, n])
                y[b, t, d] = total + float(D[d]) * u
    return y.float(), h.float()


def inputs(batch=2, length=7, channels=3, size=4, seed=0):
    torch.manual_seed(seed)
    x = torch.randn(batch, length, channels)
    dt = torch.nn.functional.softplus(torch.randn(batch, length, channels))
    A = -torch.rand(channels, size) * 2 - 0.1
    B, C = torch.randn(batch, length, size), torch.randn(batch, length, size)
    D = torch.randn(channels)
    state = torch.randn(batch, channels, size)
    return x, dt, A, B, C, D, state


@pytest.mark.parametrize(("length", "chunk"), [(8, 4), (7, 3), (7, 16), (5, 1), (13, 8)])
def test_chunked_and_recurrent_equal_the_recurrence_written_out(length: int, chunk: int) -> None:
    x, dt, A, B, C, D, state = inputs(length=length)
    want_y, want_h = reference(x, dt, A, B, C, D, state)
    y, h = selective_scan_chunked(x, dt, A, B, C, chunk=chunk, D=D, state=state)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, want_h, rtol=1e-5, atol=1e-5)
    y, h, steps = selective_scan_recurrent(x, dt, A, B, C, D=D, state=state, steps=True)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, want_h, rtol=1e-5, atol=1e-5)
    assert steps.shape == (2, length, 3, 4)
    torch.testing.assert_close(steps[:, -1], h)


def test_without_an_initial_state_it_starts_from_zeros() -> None:
    x, dt, A, B, C, D, state = inputs(length=6)
    want_y, want_h = reference(x, dt, A, B, C, D, torch.zeros_like(state))
    y, h = selective_scan_chunked(x, dt, A, B, C, chunk=4, D=D)
    torch.testing.assert_close(y, want_y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h, want_h, rtol=1e-5, atol=1e-5)
    y, h, steps = selective_scan_recurrent(x, dt, A, B, C)  # no D: no skip
    assert steps is None
    torch.testing.assert_close(y, want_y - D * x, rtol=1e-5, atol=1e-5)


def test_the_steps_are_the_states_of_every_prefix() -> None:
    x, dt, A, B, C, D, state = inputs(length=5)
    _, _, steps = selective_scan_recurrent(x, dt, A, B, C, D=D, state=state, steps=True)
    for t in range(5):
        _, h = selective_scan_chunked(x[:, :t + 1], dt[:, :t + 1], A, B[:, :t + 1], C[:, :t + 1], chunk=2, D=D,
                                      state=state)
        torch.testing.assert_close(steps[:, t], h, rtol=1e-5, atol=1e-5)


def test_a_token_with_dt_zero_leaves_the_state_unchanged() -> None:
    x, dt, A, B, C, D, state = inputs(length=6)
    dt[0, 2] = 0.0  # row 0's third token, and all of row 1, are "padding"
    dt[1] = 0.0
    _, _, steps = selective_scan_recurrent(x, dt, A, B, C, D=D, state=state, steps=True)
    torch.testing.assert_close(steps[0, 2], steps[0, 1])
    assert torch.equal(steps[1], state[1][None].expand(6, -1, -1))
    _, h = selective_scan_chunked(x, dt, A, B, C, chunk=4, D=D, state=state)
    torch.testing.assert_close(h[1], state[1])
    keep = [0, 1, 3, 4, 5]  # dropping the dt = 0 token from row 0 gives the same final state
    _, alone = selective_scan_chunked(x[:1, keep], dt[:1, keep], A, B[:1, keep], C[:1, keep], chunk=4, D=D,
                                      state=state[:1])
    torch.testing.assert_close(h[:1], alone, rtol=1e-5, atol=1e-5)


def test_split_into_two_calls_equals_one() -> None:
    x, dt, A, B, C, D, state = inputs(length=9)
    y, h = selective_scan_chunked(x, dt, A, B, C, chunk=4, D=D, state=state)
    y1, h1 = selective_scan_chunked(x[:, :5], dt[:, :5], A, B[:, :5], C[:, :5], chunk=4, D=D, state=state)
    y2, h2, _ = selective_scan_recurrent(x[:, 5:], dt[:, 5:], A, B[:, 5:], C[:, 5:], D=D, state=h1)
    torch.testing.assert_close(torch.cat((y1, y2), 1), y, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h2, h, rtol=1e-5, atol=1e-5)


def test_shapes_that_do_not_fit_are_refused() -> None:
    x, dt, A, B, C, D, state = inputs()
    with pytest.raises(ValueError, match="shapes do not fit"):
        selective_scan_chunked(x, dt, A[:, :2], B, C, chunk=4)
    with pytest.raises(ValueError, match="shapes do not fit"):
        selective_scan_recurrent(x, dt[:, :, :2], A, B, C)
    with pytest.raises(ValueError, match="chunk must be positive"):
        selective_scan_chunked(x, dt, A, B, C, chunk=0)
