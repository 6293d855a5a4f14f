"""model.mtp: multi-token prediction depths (DeepSeek-V3, arXiv:2412.19437 section 2.2), checked against the
paper's equations written out here, step by step over the model's own weights."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.model.context import ForwardContext
from specformer.model.summary import summarize
from specformer.spec.check import check_spec

from fixtures.tiny import tiny_spec

EPS = 1e-5  # the eps the spec below gives its norms


def _rms(x, weight):
    # RMSNorm: x / sqrt(mean(x^2) + eps) * w
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * weight


def _spec(depths=3, **mtp):
    return tiny_spec(vocab_size=61, block={"norm": {"kind": "rmsnorm", "eps": EPS}}, mtp={"depths": depths, **mtp})


def test_every_depths_logits_follow_the_papers_equations():
    model = specformer.build(_spec(depths=3), seed=0)
    with torch.no_grad():  # norms start at one: make them count
        for depth in model.mtp:
            for norm in (depth.enorm, depth.hnorm, depth.final_norm):
                norm.weight.uniform_(0.5, 1.5)
    ids = torch.randint(0, 61, (2, 11))
    seen = {}
    model.final_norm.register_forward_pre_hook(lambda _m, args: seen.setdefault("h", args[0]))
    with torch.no_grad():
        logits, mtp = model(ids, with_mtp=True)
        table = model.embedding.weight  # (V, D), shared by the embedding and the (tied) head
        h = seen["h"]  # h^0: the main model's last hidden state, before the final norm
        assert len(mtp) == 3
        for k, depth in enumerate(model.mtp, start=1):
            rows = ids.shape[1] - k  # positions i = 0 .. T-k-1, whose token i + k exists
            emb = table[ids[:, k:]]  # Emb(t_{i+k})   (B, T-k, D)
            # h'^k_i = M_k [RMSNorm(Emb(t_{i+k})); RMSNorm(h^{k-1}_i)]  (the published checkpoints' order)
            joined = torch.cat([_rms(emb, depth.enorm.weight), _rms(h[:, :rows], depth.hnorm.weight)], dim=-1)
            h_prime = joined @ depth.eh_proj.weight.T
            # h^k_{1:T-k} = TRM_k(h'^k_{1:T-k}): one causal block at the positions 0 .. T-k-1
            positions = torch.arange(rows).expand(2, rows)
            ctx = ForwardContext(positions=positions, positional=model.positional,
                                 positional_state=model.positional.prepare(positions), plain_causal=True)
            h = depth.block(h_prime, ctx)
            # P^k_{i+k+1} = OutHead(h^k_i): the depth's final norm, then the shared head
            expected = _rms(h, depth.final_norm.weight) @ table.T
            assert mtp[k - 1].shape == (2, rows, 61)
            torch.testing.assert_close(mtp[k - 1], expected, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(logits, model(ids), rtol=0, atol=0)


def test_a_depth_predicts_from_the_token_k_ahead_and_no_later():
    model = specformer.build(_spec(depths=2), seed=1)
    ids = torch.randint(0, 61, (1, 9))
    changed = ids.clone()
    changed[0, 6] = (ids[0, 6] + 1) % 61
    with torch.no_grad():
        _, before = model(ids, with_mtp=True)
        _, after = model(changed, with_mtp=True)
    for k in (1, 2):
        # Row i reads tokens up to i + k: rows before 6 - k cannot see token 6.
        torch.testing.assert_close(before[k - 1][:, : 6 - k], after[k - 1][:, : 6 - k], rtol=0, atol=0)
        assert not torch.allclose(before[k - 1][:, 6 - k], after[k - 1][:, 6 - k])


def test_the_main_logits_and_weights_are_those_of_the_model_without_mtp():
    plain = specformer.build(tiny_spec(vocab_size=61, block={"norm": {"kind": "rmsnorm", "eps": EPS}}), seed=0)
    model = specformer.build(_spec(depths=2), seed=0)
    keys = list(plain.state_dict())
    assert [k for k in model.state_dict() if not k.startswith("mtp.")] == keys
    assert not any(k.startswith("mtp") for k in keys) and plain.mtp is None
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("mtp.")}, strict=True)
    ids = torch.randint(0, 61, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), plain(ids), rtol=0, atol=0)
    with pytest.raises(ValueError, match="with_mtp needs a model with MTP depths"):
        plain(ids, with_mtp=True)


def test_the_parameter_count_holds_the_depths():
    spec = _spec(depths=2)
    plain = specformer.build(tiny_spec(vocab_size=61), seed=0)
    model = specformer.build(spec, seed=0)
    d = 32
    block = sum(p.numel() for p in plain.blocks[0].parameters())
    per_depth = 2 * d * d + 3 * d + block  # eh_proj, enorm + hnorm + final norm, one block
    assert model.num_parameters() == plain.num_parameters() + 2 * per_depth
    assert summarize(spec).total == summarize(model).total == model.num_parameters()
    assert summarize(spec).params["mtp"] == 2 * per_depth
    assert check_spec(spec).sizes.parameters == model.num_parameters()


def test_a_depth_may_run_another_block():
    spec = _spec(depths=1, block={"ffn": {"hidden": 16}}, input_norm={"kind": "layernorm"})
    model = specformer.build(spec, seed=0)
    assert model.mtp[0].block.ffn.down.weight.shape == (32, 16)
    assert model.blocks[0].ffn.down.weight.shape == (32, 48)
    assert type(model.mtp[0].enorm).__name__ != type(model.blocks[0].attention_norm).__name__
    assert check_spec(spec).sizes.parameters == model.num_parameters()


@pytest.mark.parametrize("mtp, path, words", [
    ({"depths": 0}, "model.mtp.depths", "greater than 0"),
    ({"depths": 2, "loss_weights": [0.1]}, "model.mtp", "loss_weights gives 1 weights for 2 depths"),
    ({"depths": 1, "loss_weights": [-1.0]}, "model.mtp", "loss_weights must be numbers >= 0"),
    ({"depths": 1, "block": {"mixer": {"n_heads": 5}}}, "model.mtp.block.mixer", "n_heads"),
    ({"depths": 1, "block": {"attention": {}}}, "model.mtp.block.attention", "unknown field"),
])
def test_a_bad_mtp_section_is_one_clear_problem(mtp, path, words):
    with pytest.raises(SpecError) as caught:
        check_spec(tiny_spec(mtp=mtp))
    assert len(caught.value.problems) == 1, caught.value.problems
    problem = caught.value.problems[0]
    assert problem.path == path and words in problem.message, problem


def test_the_default_loss_weights_are_deepseeks_lambda_over_the_depths():
    assert specformer.build(_spec(depths=3), seed=0).mtp_loss_weights == pytest.approx([0.1, 0.1, 0.1])
    assert specformer.build(_spec(depths=2, loss_weights=[0.5, 0.25]), seed=0).mtp_loss_weights == [0.5, 0.25]


def test_return_hidden_is_the_final_norms_input_at_every_position_and_mtp_depth_runs_one_depth():
    """``return_hidden`` hands back what the final norm reads (all positions, even with last_only), and
    ``mtp_depth`` run depth by depth over the hidden state gives ``mtp_logits``."""
    model = specformer.build(_spec(depths=2), seed=0)
    ids = torch.randint(0, 61, (2, 9))
    seen = {}
    model.final_norm.register_forward_pre_hook(lambda _m, args: seen.__setitem__("h", args[0]))
    with torch.no_grad():
        logits, hidden = model(ids, return_hidden=True)
        torch.testing.assert_close(hidden, seen["h"], rtol=0, atol=0)
        torch.testing.assert_close(logits, model.output_logits(model.final_norm(hidden)), rtol=0, atol=0)
        last, hidden_too = model(ids, return_hidden=True, last_only=True)
        assert last.shape == (2, 1, 61) and hidden_too.shape == (2, 9, model.d_model)
        torch.testing.assert_close(hidden_too, hidden, rtol=0, atol=0)
        _, mtp = model(ids, with_mtp=True)
        positions = torch.arange(9).expand(2, 9)
        h1 = model.mtp_depth(1, hidden[:, :8], ids[:, 1:], positions=positions[:, :8])
        torch.testing.assert_close(model.output_logits(model.mtp[0].final_norm(h1)), mtp[0], rtol=1e-6, atol=1e-6)
        h2 = model.mtp_depth(2, h1[:, :7], ids[:, 2:], positions=positions[:, :7])
        torch.testing.assert_close(model.output_logits(model.mtp[1].final_norm(h2)), mtp[1], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="with_mtp or return_hidden"):
        model(ids, with_mtp=True, return_hidden=True)
    with pytest.raises(ValueError, match="depths 1 to 2"):
        model.mtp_depth(3, hidden, ids, positions=positions)


def _attention_written_out(mixer, x, *, theta, window=None):
    """Causal GQA attention over ``x`` (B, T, D) with the mixer's weights, written out: fused q|k|v projection,
    rotate-half RoPE at ``theta`` on q and k (``theta`` None: no rotation), a key j read by query i when
    i - window < j <= i, softmax(q k^T / sqrt(hd)) v, output projection."""
    heads, kv_heads, hd = 4, 2, 8  # tiny_spec's attention over d_model 32
    b, t, _ = x.shape
    q, k, v = (x @ mixer.qkv.weight.T).split((heads * hd, kv_heads * hd, kv_heads * hd), dim=-1)
    q = q.view(b, t, heads, hd).transpose(1, 2)  # (B, H, T, hd)
    k, v = (z.view(b, t, kv_heads, hd).transpose(1, 2).repeat_interleave(heads // kv_heads, dim=1) for z in (k, v))
    if theta is not None:
        inv_freq = theta ** (-torch.arange(0, hd, 2, dtype=torch.float32) / hd)  # (hd/2,)
        angle = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq  # (T, hd/2)
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)  # (T, hd)

        def rotate(z):  # z * cos + rotate_half(z) * sin, rotate_half(a, b) = (-b, a)
            return z * cos + torch.cat([-z[..., hd // 2:], z[..., : hd // 2]], -1) * sin

        q, k = rotate(q), rotate(k)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (j <= i) & ((i - j < window) if window is not None else True)
    scores = (q @ k.transpose(-1, -2) / hd ** 0.5).masked_fill(~allowed, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, heads * hd)
    return out @ mixer.out.weight.T


@pytest.mark.parametrize("positional, theta, window", [
    ("none", None, None),  # a NoPE depth (K-EXAONE's MTP layer) over a RoPE model
    ({"theta": 500.0}, 500.0, 3),  # its own theta and a window (Mellum's sliding MTP layer), merged into model.positional
    ({"kind": "rope", "theta": 10.0}, 10.0, None),
])
def test_a_depth_reads_its_own_positional_scheme(positional, theta, window):
    block = {"positional": positional, **({"mixer": {"window": window}} if window else {})}
    spec = _spec(depths=2, block=block)
    model = specformer.build(spec, seed=0)
    assert model.positional.theta == 10000.0 and all(d.positional is not None for d in model.mtp)
    ids = torch.randint(0, 61, (2, 9))
    seen = []
    for depth in model.mtp:
        depth.block.mixer.register_forward_hook(lambda _m, args, out: seen.append((args[0], out)))
    with torch.no_grad():
        logits, mtp = model(ids, with_mtp=True)
        for depth, (x, out) in zip(model.mtp, seen):
            expected = _attention_written_out(depth.block.mixer, x, theta=theta, window=window)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        # The main layers keep the model's scheme: the same logits as the model without the depths' change.
        plain = specformer.build(_spec(depths=2), seed=0)
        plain.load_state_dict(model.state_dict(), strict=True)
        torch.testing.assert_close(plain(ids), logits, rtol=0, atol=0)
        assert not torch.allclose(plain(ids, with_mtp=True)[1][0], mtp[0])
        # mtp_depth (the drafter's entry) runs the depth with its own scheme too.
        _, hidden = model(ids, return_hidden=True)
        alone = model.mtp_depth(1, hidden[:, :8], ids[:, 1:], positions=torch.arange(8).expand(2, 8))
        torch.testing.assert_close(model.output_logits(model.mtp[0].final_norm(alone)), mtp[0], rtol=1e-5, atol=1e-5)
    assert summarize(spec).total == summarize(model).total == model.num_parameters() == check_spec(spec).sizes.parameters


def test_a_depths_scheme_with_weights_is_counted_and_one_that_cannot_act_in_attention_is_refused():
    spec = _spec(depths=2, block={"positional": {"kind": "relative_bias", "n_buckets": 8, "max_distance": 16}})
    model = specformer.build(spec, seed=0)
    own = sum(p.numel() for p in model.mtp[0].positional.parameters())
    assert own > 0
    assert summarize(spec).params["mtp"] == summarize(_spec(depths=2)).params["mtp"] + 2 * own
    assert summarize(spec).total == model.num_parameters() == check_spec(spec).sizes.parameters
    for positional, words in (("learned", "belongs in model.positional only"),):
        with pytest.raises(SpecError) as caught:
            check_spec(_spec(depths=1, block={"positional": positional}))
        assert [p.path for p in caught.value.problems] == ["model.mtp.block.positional"]
        assert words in caught.value.problems[0].message
