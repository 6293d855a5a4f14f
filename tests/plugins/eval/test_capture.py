"""Capturing the residual stream and attention probabilities, and the logit lens.

Attention probabilities are checked against the mask written out here (a query sees keys
at its own or earlier positions, within the window, never padding) for every registered
attention, with left-padded batches, sliding windows and ALiBi, in every layout.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import specformer
from specformer.errors import SpecError
from specformer_eval import capture, lens_agreement, lens_of, logit_lens
from specformer_eval.lens import Lens
from fixtures.tiny import tiny_spec

VOCAB = 61
#: Example params of the built-in attention; another plugin's attention is tried with n_heads alone.
ATTENTION_VARIANTS = {
    "attention": [
        {"n_heads": 4, "n_kv_heads": 2},
        {"n_heads": 4, "n_kv_heads": 1, "window": 3},
        {"n_heads": 4, "logit_softcap": 5.0, "qk_norm": "rmsnorm"},
    ],
    "mla": [
        {"n_heads": 4, "kv_lora_rank": 12, "qk_rope_head_dim": 8, "qk_nope_head_dim": 4, "v_head_dim": 6},
        {"n_heads": 4, "kv_lora_rank": 12, "qk_rope_head_dim": 8, "qk_nope_head_dim": 0, "v_head_dim": 8,
         "q_lora_rank": 10, "window": 3},
    ],
}


def build(seed: int = 0, **changes: Any) -> Any:
    block = {part: changes.pop(part) for part in ("layout", "mixer") if part in changes}
    built = specformer.build(tiny_spec(**{"vocab_size": VOCAB, "n_layers": 3, **changes}, block=block), seed=seed)
    with torch.no_grad():
        for p in built.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return built.eval()


def attention_cases() -> list[Any]:
    """Every softmax attention (a recurrent mixer has no probabilities to report: see the test below)."""
    cases = []
    for name in specformer.get_registry().names("mixer"):
        if name in RECURRENT:
            continue
        for i, params in enumerate(ATTENTION_VARIANTS.get(name, [{"n_heads": 4}])):
            for positional in ("rope", "alibi"):
                cases.append(pytest.param({"kind": name, **params}, positional, id=f"{name}-{i}-{positional}"))
    return cases


#: Mixers without attention probabilities (their capture entry is None); cca attends but keeps a state beside its
#: keys, and capture asks only layers without a state (as it skips compressed attention's pooled layers).
RECURRENT = ("gated_deltanet", "kda", "mamba2", "mamba", "rglru", "rwkv4", "lightning", "mlstm", "short_conv", "none",
             "cca")


def test_a_recurrent_layer_has_no_probabilities_and_the_attention_beside_it_has() -> None:
    spec = tiny_spec(block={"mixer": {"kind": "gated_deltanet", "n_heads": 4}},
                     layers=[{"select": 1, "mixer": {"kind": "attention", "n_heads": 4}}])
    model = specformer.build(spec, seed=0).eval()
    ids = torch.randint(0, model.vocab_size, (1, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), capture(model, attention=True) as cap:
        model(ids)
    assert cap.attention[0] is None and cap.attention[1].shape == (1, 4, 6, 6)
    assert cap.n_layers == 2


def padded_batch(length: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows: full, left-padded by 4, left-padded by 9 (positions -1 on padding)."""
    ids = torch.randint(0, VOCAB, (3, length), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(length).repeat(3, 1)
    for row, pad in ((1, 4), (2, 9)):
        positions[row] = torch.cat((torch.full((pad,), -1), torch.arange(length - pad)))
    return ids, positions


def allowed(positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """(B, T, T): query i may see key j."""
    q, k = positions[:, :, None], positions[:, None, :]
    ok = (k >= 0) & (k <= q)
    if window is not None:
        ok &= q - k < window
    return ok


@pytest.mark.parametrize("attention,positional", attention_cases())
def test_probabilities_sum_to_one_over_allowed_keys_and_are_zero_elsewhere(attention, positional):
    try:
        model = build(mixer=attention, positional={"kind": positional})
    except SpecError as exc:
        pytest.skip(f"attention {attention['kind']!r} needs params this test cannot guess: {exc}")
    ids, positions = padded_batch()
    with torch.no_grad():
        plain = model(ids, positions=positions)
        with capture(model, attention=True) as cap:
            observed = model(ids, positions=positions)
    assert (observed - plain).abs().max() < 1e-5  # the written-out path computes the same thing
    ok = allowed(positions, attention.get("window"))
    real = positions >= 0  # padding queries' rows are never used
    assert len(cap.attention) == 3
    for layer, probs in enumerate(cap.attention):
        assert probs.shape == (3, 4, 12, 12) and probs.dtype == torch.float32
        probs = probs.permute(0, 2, 1, 3)  # (B, T, H, S)
        rows = probs[real]  # (queries, H, S)
        keys_ok = ok[real][:, None, :].expand_as(rows)
        assert torch.allclose(rows.sum(-1), torch.ones(rows.shape[:-1]), atol=1e-5), layer
        assert (rows[~keys_ok] == 0).all(), layer
        assert (rows[keys_ok] > 0).all(), layer  # every allowed key gets some weight


@pytest.mark.parametrize("layout", sorted(specformer.get_registry().names("layout")))
def test_residual_stream_and_logit_lens_in_every_layout(layout):
    model = build(layout=layout)
    ids = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(ids)
    lens, cap = lens_of(model, ids, k=4)
    assert len(cap.residual) == 4 and all(r.shape == (2, 10, 32) for r in cap.residual)
    assert torch.equal(cap.residual[0], model.embedding(ids))  # rope adds nothing to the embeddings
    with torch.no_grad():
        assert torch.equal(model.head_logits(cap.residual[-1]), logits)
    top = torch.softmax(logits.float(), dim=-1).topk(4, dim=-1)
    assert lens.ids.shape == (4, 2, 10, 4)
    assert torch.equal(lens.ids[-1], top.indices) and torch.allclose(lens.probs[-1], top.values, atol=1e-6)
    # Each earlier layer is read the same way, through the final norm and the head.
    with torch.no_grad():
        middle = torch.softmax(model.head_logits(cap.residual[1]).float(), dim=-1).topk(4, dim=-1)
    assert torch.equal(lens.ids[1], middle.indices)


def test_the_lens_of_a_learned_position_model_starts_from_embeddings_plus_positions():
    model = build(positional={"kind": "learned"})
    ids = torch.randint(0, VOCAB, (1, 8))
    _, cap = lens_of(model, ids)
    with torch.no_grad():
        expected = model.embedding(ids) + model.positional.embed(torch.arange(8)[None])
    assert torch.allclose(cap.residual[0], expected)


def test_nothing_stays_hooked_after_the_block(monkeypatch):
    model = build()
    with capture(model, attention=True):
        model(torch.zeros(1, 4, dtype=torch.long))
    assert all(not b._forward_hooks and not b._forward_pre_hooks for b in model.blocks)
    assert all(m.observe_weights is None for m in model.attention_modules())
    # Outside a capture the fused kernel runs: the written-out softmax is never called.
    from specformer_layers.attention import kernels

    monkeypatch.setattr(kernels, "eager", lambda *a, **k: pytest.fail("written-out path taken while not capturing"))
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long))


def test_each_forward_replaces_the_last():
    model = build()
    with torch.no_grad(), capture(model, attention=True) as cap:
        model(torch.zeros(1, 5, dtype=torch.long))
        model(torch.zeros(2, 7, dtype=torch.long))
    assert len(cap.residual) == 4 and cap.residual[0].shape == (2, 7, 32) and cap.attention[0].shape == (2, 4, 7, 7)


def test_an_attention_that_cannot_report_is_named():
    model = build()

    class Opaque(nn.Module):  # an attention (it has heads) that hands nothing to an observer
        n_heads, head_dim = 2, 16

        def forward(self, x, ctx):
            return x

    model.blocks[1].mixer = Opaque()
    with pytest.raises(ValueError, match=r"layer 1's attention \(Opaque\) cannot report its probabilities"):
        with capture(model, attention=True):
            pass
    with capture(model) as cap:  # the residual stream needs nothing from attention
        model(torch.zeros(1, 3, dtype=torch.long))
    assert len(cap.residual) == 4
    with pytest.raises(ValueError, match="needs a specformer Decoder"):
        with capture(nn.Linear(2, 2)):
            pass


def test_lens_agreement_by_formula():
    ids = torch.tensor([[5, 6, 7, 8]])
    top = torch.tensor([
        [[5, 6, 7, 8]],  # layer 0: the current token everywhere
        [[6, 7, 1, 2]],  # layer 1: the next token at 2 of 3 positions that have one
    ])  # (L+1, B, T)
    lens = Lens(ids=top[..., None], probs=torch.ones(2, 1, 4, 1))
    current, following = lens_agreement(lens, ids)
    assert current.tolist() == [1.0, 0.0]
    assert following.tolist() == pytest.approx([0.0, 2 / 3])


def test_k_is_checked():
    model = build()
    _, cap = lens_of(model, torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="k must be between 1 and the vocabulary size 61"):
        logit_lens(model, cap, k=0)
