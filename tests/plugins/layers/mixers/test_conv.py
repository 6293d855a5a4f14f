"""The short causal convolution: the sum written out, its window carried across forwards, padding kept out."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specformer_layers.mixers.conv import causal_conv


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, history: torch.Tensor) -> torch.Tensor:
    """out[t, c] = bias[c] + sum_j weight[c, j] * input[t - (K-1) + j, c], inputs before x taken from ``history``."""
    kernel = weight.shape[1]
    stream = torch.cat((history.transpose(1, 2), x), dim=1)  # (B, K-1+T, C)
    out = torch.zeros_like(x)
    for t in range(x.shape[1]):
        for j in range(kernel):
            out[:, t] += weight[:, j] * stream[:, t + j]
    return out if bias is None else out + bias


@pytest.mark.parametrize("length", [7, 40])  # written out as shifted sums up to SHIFTED_UP_TO (32) tokens, conv1d past it
@pytest.mark.parametrize("kernel", [2, 3, 4])
def test_matches_the_sum_written_out(kernel: int, length: int) -> None:
    torch.manual_seed(0)
    x, weight, bias = torch.randn(2, length, 5), torch.randn(5, kernel), torch.randn(5)
    history = torch.randn(2, 5, kernel - 1)
    got = causal_conv(x, weight, bias, window=history)
    torch.testing.assert_close(got.out, reference(x, weight, bias, history), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.window, torch.cat((history, x.transpose(1, 2)), 2)[:, :, -(kernel - 1):])


@pytest.mark.parametrize("kernel", [2, 4])
def test_token_by_token_equals_all_at_once(kernel: int) -> None:
    torch.manual_seed(1)
    x, weight = torch.randn(3, 9, 4), torch.randn(4, kernel)
    whole = causal_conv(x, weight, activation="silu", steps=True)
    window, outs = None, []
    for t in range(x.shape[1]):
        step = causal_conv(x[:, t:t + 1], weight, window=window, activation="silu")
        outs.append(step.out)
        torch.testing.assert_close(whole.steps[:, t], step.window)
        window = step.window
    torch.testing.assert_close(torch.cat(outs, 1), whole.out)
    torch.testing.assert_close(window, whole.window)
    assert torch.equal(whole.out, F.silu(causal_conv(x, weight).out))


def test_leading_padding_never_enters_the_window() -> None:
    torch.manual_seed(2)
    kernel = 4
    weight, history = torch.randn(3, kernel), torch.randn(2, 3, kernel - 1)
    real = torch.randn(2, 2, 3)
    alone = causal_conv(real, weight, window=history, steps=True)
    garbage = torch.randn(2, 3, 3)
    padded = causal_conv(torch.cat((garbage, real), 1), weight, window=history, padding=torch.tensor([3, 3]), steps=True)
    torch.testing.assert_close(padded.out[:, 3:], alone.out)
    torch.testing.assert_close(padded.window, alone.window)
    torch.testing.assert_close(padded.steps[:, 3:], alone.steps)
    assert torch.equal(padded.steps[:, :3], history[:, None].expand(2, 3, 3, kernel - 1))


def test_rows_padded_differently() -> None:
    torch.manual_seed(3)
    weight = torch.randn(2, 3)
    history = torch.randn(2, 2, 2)
    x = torch.randn(2, 4, 2)
    got = causal_conv(x, weight, window=history, padding=torch.tensor([0, 3]))
    row0 = causal_conv(x[:1], weight, window=history[:1])
    row1 = causal_conv(x[1:, 3:], weight, window=history[1:])
    torch.testing.assert_close(got.out[:1], row0.out)
    torch.testing.assert_close(got.out[1:, 3:], row1.out)
    torch.testing.assert_close(got.window, torch.cat((row0.window, row1.window)))


def test_a_row_of_padding_only_keeps_its_window() -> None:
    weight, history = torch.randn(2, 3), torch.randn(1, 2, 2)
    got = causal_conv(torch.randn(1, 5, 2), weight, window=history, padding=torch.tensor([5]))
    assert torch.equal(got.window, history)


def test_unknown_activation_is_refused() -> None:
    with pytest.raises(ValueError, match="'silu' and None, got 'gelu'"):
        causal_conv(torch.randn(1, 2, 2), torch.randn(2, 2), activation="gelu")
