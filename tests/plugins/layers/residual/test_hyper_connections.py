"""Manifold-constrained hyper-connections (mhc): the written-out formulas, transformers' DeepSeek-V4 modules,
every layout, the generation cache, checkpoints and training."""

from __future__ import annotations

import math

import pytest
import torch

import specformer
from fixtures.tiny import tiny_spec
from specformer.errors import SpecError
from specformer.registry.discovery import get_registry
from specformer_layers.residual.hyper_connections import HyperConnection, HyperConnections, sinkhorn
from specformer_layers.residual.params import HyperConnectionsParams

N, D = 3, 8


def _randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight random (the init's zero bases and unit scales would hide a swapped group)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5 + 0.1)
    return module


def _streams(seed: int, *, batch: int = 2, length: int = 5, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(batch, length, N, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


# -- the formulas, written out one token at a time -------------------------------------------------


def _reference_weights(h: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, *,
                       iterations: int, eps: float, norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pre (N,), post (N,), comb (N, N) of one token's streams h (N, D), from the mHC equations."""
    flat = h.reshape(-1)
    normed = flat / torch.sqrt((flat * flat).mean() + norm_eps)
    logits = fn @ normed + 0.0
    pre = [1 / (1 + math.exp(-(logits[i] * scale[0] + base[i]))) + eps for i in range(N)]
    post = [2 / (1 + math.exp(-(logits[N + i] * scale[1] + base[N + i]))) for i in range(N)]
    comb = torch.empty(N, N, dtype=h.dtype)
    for i in range(N):
        row = [math.exp(logits[2 * N + i * N + j] * scale[2] + base[2 * N + i * N + j]) for j in range(N)]
        for j in range(N):
            comb[i, j] = row[j] / sum(row) + eps
    for step in range(iterations):
        if step > 0:  # rows from the second step on; columns every step
            comb = torch.stack([comb[i] / (comb[i].sum() + eps) for i in range(N)])
        comb = torch.stack([comb[:, j] / (comb[:, j].sum() + eps) for j in range(N)], dim=1)
    return torch.tensor(pre, dtype=h.dtype), torch.tensor(post, dtype=h.dtype), comb


@torch.no_grad()
def test_a_connection_reads_and_writes_the_streams_as_the_formulas_say() -> None:
    params = HyperConnectionsParams(n_streams=N, sinkhorn_iterations=5, eps=1e-3, norm_eps=1e-5)
    conn = _randomised(HyperConnection(params, d_model=D).double(), seed=0)
    h = _streams(1)
    out = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    read, mix = conn.read(h)
    written = conn.write(h, out, mix=mix)
    for b in range(2):
        for t in range(5):
            pre, post, comb = _reference_weights(h[b, t], conn.fn, conn.base, conn.scale, iterations=5, eps=1e-3,
                                                 norm_eps=1e-5)
            torch.testing.assert_close(read[b, t], sum(pre[j] * h[b, t, j] for j in range(N)))
            for k in range(N):
                want = post[k] * out[b, t] + sum(comb[j, k] * h[b, t, j] for j in range(N))
                torch.testing.assert_close(written[b, t, k], want)


@torch.no_grad()
def test_the_stream_mixing_is_doubly_stochastic() -> None:
    params = HyperConnectionsParams(n_streams=N)  # DeepSeek-V4's 20 iterations
    conn = _randomised(HyperConnection(params, d_model=D).double(), seed=3)
    _, (post, comb) = conn.read(_streams(4))
    assert (comb > 0).all() and (post > 0).all() and (post < 2).all()
    torch.testing.assert_close(comb.sum(-2), torch.ones(2, 5, N, dtype=torch.float64), rtol=0, atol=1e-5)  # columns
    torch.testing.assert_close(comb.sum(-1), torch.ones(2, 5, N, dtype=torch.float64), rtol=0, atol=1e-3)  # rows


def test_sinkhorn_converges_to_a_doubly_stochastic_matrix() -> None:
    positive = torch.rand(4, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64) + 0.01
    out = sinkhorn(positive, iterations=200, eps=0.0)
    torch.testing.assert_close(out.sum(0), torch.ones(4, dtype=torch.float64))
    torch.testing.assert_close(out.sum(1), torch.ones(4, dtype=torch.float64))
    once = sinkhorn(positive, iterations=1, eps=0.0)  # one column normalisation only
    torch.testing.assert_close(once, positive / positive.sum(0, keepdim=True))


@torch.no_grad()
def test_the_head_collapses_with_its_own_pre_weights_and_expansion_copies() -> None:
    stream = _randomised(HyperConnections(HyperConnectionsParams(n_streams=N, eps=1e-3), d_model=D).double(), seed=6)
    x = torch.randn(2, 5, D, dtype=torch.float64)
    assert torch.equal(stream.expand(x), x.unsqueeze(2).repeat(1, 1, N, 1))
    h = _streams(7)
    got = stream.collapse(h)
    for b in range(2):
        for t in range(5):
            flat = h[b, t].reshape(-1)
            normed = flat / torch.sqrt((flat * flat).mean() + 1e-6)
            pre = torch.sigmoid(stream.fn @ normed * stream.scale[0] + stream.base) + 1e-3
            torch.testing.assert_close(got[b, t], (pre[:, None] * h[b, t]).sum(0))


# -- transformers' DeepSeek-V4 modules with the same weights ---------------------------------------


def _deepseek_v4() -> tuple[type, type, object]:
    modeling = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")
    config = modeling.DeepseekV4Config(hidden_size=D, hc_mult=N, hc_sinkhorn_iters=7, hc_eps=1e-4, rms_norm_eps=1e-5,
                                       num_hidden_layers=1)
    return modeling.DeepseekV4HyperConnection, modeling.DeepseekV4HyperHead, config


@torch.no_grad()
def test_a_connection_is_transformers_deepseek_v4_hyper_connection() -> None:
    connection, _, config = _deepseek_v4()
    theirs = _randomised(connection(config), seed=8).float()
    ours = HyperConnection(HyperConnectionsParams(n_streams=N, sinkhorn_iterations=7, eps=1e-4, norm_eps=1e-5), d_model=D)
    ours.load_state_dict(theirs.state_dict())  # fn, base, scale: the same names and shapes
    h = _streams(9, dtype=torch.float32)
    out = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(10))
    post, comb, collapsed = theirs(h)
    their_next = post.unsqueeze(-1) * out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), h)  # the decoder layer's
    read, mix = ours.read(h)
    torch.testing.assert_close(read, collapsed, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.write(h, out, mix=mix), their_next, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_the_head_is_transformers_deepseek_v4_hyper_head() -> None:
    _, head, config = _deepseek_v4()
    theirs = _randomised(head(config), seed=11).float()
    ours = HyperConnections(HyperConnectionsParams(n_streams=N, sinkhorn_iterations=7, eps=1e-4, norm_eps=1e-5), d_model=D)
    ours.load_state_dict({k.removeprefix("hc_"): v for k, v in theirs.state_dict().items()})
    h = _streams(12, dtype=torch.float32)
    torch.testing.assert_close(ours.collapse(h), theirs(h), rtol=1e-5, atol=1e-5)


# -- in a model --------------------------------------------------------------------------------------


def _mhc_spec(layout: str = "prenorm", **params: object) -> dict:
    return tiny_spec(block={"layout": layout, "residual": {"kind": "mhc", "n_streams": N, **params}})


LAYOUTS = get_registry().names("layout")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_runs_on_the_streams_or_says_why_not(layout: str) -> None:
    if layout == "postnorm":
        with pytest.raises(SpecError, match=r"model\.block\.layout: postnorm normalises the residual stream itself"):
            specformer.build(_mhc_spec(layout))
        return
    model = specformer.build(_mhc_spec(layout), seed=0)
    connections = [m for m in model.modules() if isinstance(m, HyperConnection)]
    assert len(connections) == (2 if layout == "parallel" else 4)  # per block: one shared write, or one per sublayer
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(0))
    logits = model(ids)
    assert logits.shape == (2, 7, 97) and torch.isfinite(logits).all()
    # The streams differ from one another after the first connection: the model is not one stream copied.
    h = model.residual.expand(model.embedding(ids))
    conn = model.blocks[0].residual if layout == "parallel" else model.blocks[0].attention_residual
    with torch.no_grad():
        conn.base.normal_()
        _, mix = conn.read(h)
        written = conn.write(h, torch.randn(2, 7, 32), mix=mix)
    assert not torch.allclose(written[:, :, 0], written[:, :, 1])


def test_weight_names_map_one_to_one_onto_deepseek_v4s() -> None:
    names = dict(specformer.build(_mhc_spec(), device="meta").named_parameters())
    assert names["blocks.1.attention_residual.fn"].shape == (N * (N + 2), N * 32)  # layers.1.attn_hc.fn
    assert names["blocks.1.ffn_residual.base"].shape == (N * (N + 2),)  # layers.1.ffn_hc.base
    assert names["blocks.1.ffn_residual.scale"].shape == (3,)
    assert names["residual.fn"].shape == (N, N * 32)  # hc_head.hc_fn
    assert names["residual.base"].shape == (N,) and names["residual.scale"].shape == (1,)


@torch.no_grad()
def test_generating_through_the_cache_gives_what_recompute_gives() -> None:
    """(Logit for logit through the cache, under every layout: the contract test's residual checks.)"""
    from specformer_generate import generate

    model = specformer.build(_mhc_spec(), seed=0).double().eval()
    prompt = torch.randint(0, 97, (1, 4), generator=torch.Generator().manual_seed(1))
    assert torch.equal(generate(model, prompt, max_new_tokens=6), generate(model, prompt, max_new_tokens=6, use_cache=False))


def test_a_checkpoint_keeps_the_streams_weights(tmp_path) -> None:
    model = specformer.build(_mhc_spec(sinkhorn_iterations=5), seed=3)
    specformer.save(model, tmp_path / "m.safetensors")
    loaded = specformer.load(tmp_path / "m.safetensors")
    assert loaded.spec.model.block.residual.as_dict() == {"kind": "mhc", "n_streams": N, "sinkhorn_iterations": 5}
    ids = torch.randint(0, 97, (1, 6))
    with torch.no_grad():
        assert torch.equal(loaded(ids), model(ids))


def test_a_few_training_steps_lower_the_loss_and_reach_every_stream_weight() -> None:
    model = specformer.build(_mhc_spec(), seed=4)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(4))
    losses = []
    for _ in range(4):
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        model.zero_grad()
        loss.backward()
        if not losses:
            stream_weights = [(n, p) for n, p in model.named_parameters() if "residual" in n]
            assert len(stream_weights) == 3 + 2 * 2 * 3
            assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in stream_weights)
        with torch.no_grad():  # plain SGD: the point is that gradients flow, not the optimiser
            for p in model.parameters():
                p -= 0.5 * p.grad
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1


# -- the default is today's single stream ---------------------------------------------------------


def test_the_default_single_stream_adds_no_weight_and_changes_no_logit() -> None:
    default = specformer.build(tiny_spec(block={"layout": "sandwich"}), seed=5)
    explicit = specformer.build(tiny_spec(block={"layout": "sandwich", "residual": "single"}), seed=5)
    assert list(default.state_dict()) == list(explicit.state_dict())
    assert not [n for n in default.state_dict() if "residual" in n]
    ids = torch.randint(0, 97, (2, 7))
    with torch.no_grad():
        assert torch.equal(default(ids), explicit(ids))
    assert specformer.summarize(default).residual_stream is None


def test_the_logit_lens_reads_every_layer_through_the_streams_head() -> None:
    from specformer_eval import lens_of

    model = specformer.build(_mhc_spec(), seed=6).eval()
    ids = torch.randint(0, 97, (1, 6), generator=torch.Generator().manual_seed(6))
    lens, cap = lens_of(model, ids, k=3)
    assert [tuple(r.shape) for r in cap.residual] == [(1, 6, N, 32)] * 3
    with torch.no_grad():
        assert torch.equal(lens.ids[-1, ..., 0], model(ids).argmax(-1))  # the last layer's lens is the model's own


def test_summary_names_the_streams() -> None:
    from specformer.model.summary import format_summary

    text = format_summary(specformer.summarize(_mhc_spec()))
    assert f"residual stream                mhc: {N} streams, Sinkhorn 20 iterations" in text
    assert "residual stream" not in format_summary(specformer.summarize(tiny_spec()))
