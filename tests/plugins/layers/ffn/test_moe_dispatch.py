"""The MoE's expert dispatch: the in-place inference path, the autograd path and the portable combine agree.

``MoE.run_experts`` has two ways to assemble the experts' outputs (written straight into one
buffer without autograd; concatenated with it) and two ways to sum each token's slots
(``index_add_`` on the CPU; a copy back to slot order elsewhere and when compiling). Each is
checked against the dense per-token reference of test_moe, and the properties generation
relies on (same result run to run, a batch row equal to the row alone) are checked bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from specformer_layers.ffn.moe import MoE, _combine
from specformer_layers.ffn.params import MoEParams

from .test_moe import CONFIGS, _random_moe, dense_reference


@pytest.mark.parametrize("config", CONFIGS)
def test_inference_path_matches_dense_reference_and_the_autograd_path(config: dict) -> None:
    moe = _random_moe(**config)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    with_autograd = moe(x)
    assert with_autograd.requires_grad  # the concatenating path ran
    with torch.no_grad():
        in_place = moe(x)
    torch.testing.assert_close(in_place, dense_reference(moe, x, normalize=config.get("normalize_topk", True)))
    # Same matmuls, same weighting, same sum order: not just close, equal.
    assert torch.equal(in_place, with_autograd.detach())


@pytest.mark.parametrize("expert_bias", [False, True])
def test_inference_path_skips_empty_experts(expert_bias: bool) -> None:
    moe = _random_moe(n_experts=8, top_k=1, expert_bias=expert_bias)
    x = torch.randn(1, 2, 16, dtype=torch.float64)  # 2 tokens, 8 experts: at least 6 get nothing
    with torch.inference_mode():
        y = moe(x)
    torch.testing.assert_close(y, dense_reference(moe, x))


def _grid(shape: tuple[int, ...], *, levels: int, step: float, generator: torch.Generator) -> torch.Tensor:
    """Multiples of ``step`` (a power of two) between ``-levels * step`` and ``levels * step``."""
    return torch.randint(-levels, levels + 1, shape, generator=generator).float() * step


@pytest.mark.parametrize("compiling", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_batch_rows_equal_rows_alone_and_runs_repeat_exactly(grad: bool, compiling: bool,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Bit for bit on both sums (index_add_ and, as when compiling, the slot-order copy).

    Only the dispatch and the sums are under test, not the matmul library: an expert's block
    has as many rows as tokens chosen it, and how a matmul kernel splits its rows differs
    between kernels and thread counts. So every matmul here is exact in float32, on any kernel:
    inputs, router and expert weights are coarse dyadic grids and the activation is relu (the
    largest possible sum, under ``48 * 33 * 33 * 0.5`` in multiples of 1/256, needs 23 bits). The routing
    weights (a softmax) are not, so weighting and summing a token's three slots rounds, and a
    sum whose order depended on the other tokens would show.
    """
    if compiling:  # the portable combine and the concatenating path, as torch.compile traces them
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    g = torch.Generator().manual_seed(0)
    moe = MoE(MoEParams(n_experts=8, top_k=3, hidden=48, expert_bias=True, activation="relu"), d_model=64)
    with torch.no_grad():
        moe.router.weight.copy_(_grid(tuple(moe.router.weight.shape), levels=1024, step=2.0**-10, generator=g))
        for stack in (moe.experts_in, moe.experts_out, moe.experts_in_bias, moe.experts_out_bias):
            stack.copy_(_grid(tuple(stack.shape), levels=2, step=0.25, generator=g))
    x = _grid((6, 40, 64), levels=2, step=0.5, generator=g)
    with torch.set_grad_enabled(grad):
        batch = moe(x).detach()
        again = moe(x).detach()
        alone = [moe(x[i:i + 1]).detach() for i in range(x.shape[0])]
    assert torch.equal(batch, again)
    for i, row in enumerate(alone):
        assert torch.equal(batch[i:i + 1], row), f"batch row {i} differs from the row alone"
    torch.testing.assert_close(batch, dense_reference(moe.double(), x.double()).float())  # and not all zeros
    assert (batch != 0).float().mean() > 0.9


def test_portable_combine_matches_dense_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sum used off the CPU (and when compiling), exercised here on the CPU."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    moe = _random_moe(top_k=3, expert_bias=True)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    torch.testing.assert_close(moe(x), dense_reference(moe, x))


def test_expert_gradients_through_the_dispatch_match_the_dense_reference() -> None:
    """Backward of the gather, the weighting and index_add_ into every expert's weights and biases."""
    moe = _random_moe(top_k=3, expert_bias=True)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    probe = torch.randn(2, 5, 16, dtype=torch.float64)
    (moe(x) * probe).sum().backward()
    ours = {name: p.grad.clone() for name, p in moe.named_parameters() if name.startswith("experts")}
    moe.zero_grad()
    # The reference's routing weights are plain numbers: only the experts' gradients compare.
    (dense_reference(moe, x) * probe).sum().backward()
    assert len(ours) == 4
    for name, grad in ours.items():
        torch.testing.assert_close(grad, dict(moe.named_parameters())[name].grad, msg=name)

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_combine_adds_each_tokens_slots_in_expert_order_with_two_threads(dtype: torch.dtype) -> None:
    """index_add_ (serial, or sorted and row-parallel) equals adding a token's rows one by one, bit for bit."""
    torch.manual_seed(0)
    n_tokens, k, n_experts, d = 300, 4, 16, 96
    experts = torch.rand(n_tokens, n_experts).argsort(dim=-1)[:, :k]  # (N, k), distinct per token
    order = experts.flatten().argsort(stable=True)
    token_of = order // k
    sorted_out = torch.randn(n_tokens * k, d).to(dtype)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = _combine(sorted_out, token_of=token_of, order=order, n_tokens=n_tokens)
    finally:
        torch.set_num_threads(threads)
    expected = torch.zeros(n_tokens, d, dtype=torch.float32)  # float32 sums (index_add_ accumulates bf16 in float32)
    for row, token in enumerate(token_of.tolist()):  # sorted by expert: each token's experts in ascending order
        expected[token] += sorted_out[row].float()
    assert torch.equal(got, expected.to(dtype))
