"""BitLinear against its formulas written out value by value; the straight-through gradients; the layers naming it."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from specformer.registry.params import resolve_component
from specformer_layers.linear.bitlinear import BitLinear
from specformer_layers.linear.bitlinear_params import BitLinearParams


def ternary_reference(w: list[list[float]]) -> list[list[float]]:
    """absmean, scalar by scalar: m = mean |W|; W_q = clamp(round(W / m), -1, 1) * m."""
    flat = [abs(v) for row in w for v in row]
    m = max(sum(flat) / len(flat), 1e-5)
    return [[max(-1.0, min(1.0, float(round(v / m)))) * m for v in row] for row in w]


def activation_reference(x: list[float]) -> list[float]:
    """One token: s = 127 / max|x|; x_q = clamp(round(x s), -128, 127) / s."""
    s = 127.0 / max(max(abs(v) for v in x), 1e-5)
    return [max(-128.0, min(127.0, float(round(v * s)))) / s for v in x]


def matmul(x: list[float], w: list[list[float]], b: list[float] | None) -> list[float]:
    return [sum(xi * wi for xi, wi in zip(x, row)) + (b[o] if b else 0.0) for o, row in enumerate(w)]


@pytest.mark.parametrize("bias", [False, True])
def test_the_formulas_value_by_value(bias: bool) -> None:
    torch.manual_seed(0)
    layer = BitLinear(in_features=7, out_features=5, bias=bias).double()
    x = torch.randn(3, 4, 7, dtype=torch.float64) * torch.tensor([1.0, 30.0, 0.01, 2.0])[None, :, None]
    w_q = ternary_reference(layer.weight.tolist())
    b = layer.bias.tolist() if bias else None
    want = torch.tensor([[matmul(activation_reference(tok), w_q, b) for tok in row] for row in x.tolist()],
                        dtype=torch.float64)
    torch.testing.assert_close(layer(x), want, rtol=1e-12, atol=1e-12)


def test_the_weights_are_ternary_times_one_scale_and_activations_on_the_int8_grid() -> None:
    torch.manual_seed(1)
    layer = BitLinear(in_features=16, out_features=8)
    seen: dict[str, torch.Tensor] = {}
    layer.register_forward_hook(lambda m, args, out: seen.update(x=args[0]))
    from specformer_layers.linear.bitlinear import quantize_activations, quantize_weight
    w_q = quantize_weight(layer.weight, (8,), eps=1e-5)
    m = layer.weight.abs().mean()
    codes = (w_q / m).round()
    assert set(codes.unique().tolist()) <= {-1.0, 0.0, 1.0} and {-1.0, 1.0} <= set(codes.unique().tolist())
    torch.testing.assert_close(w_q, codes * m)
    x = torch.randn(5, 16)
    x_q = quantize_activations(x, eps=1e-5)
    step = x.abs().amax(-1, keepdim=True) / 127
    ints = x_q / step
    torch.testing.assert_close(ints, ints.round(), rtol=0, atol=1e-4)
    assert ints.abs().max() <= 127.0 + 1e-4


def test_a_fused_projection_keeps_one_absmean_per_part() -> None:
    torch.manual_seed(2)
    fused = BitLinear(in_features=6, out_features=9, splits=(3, 4, 2)).double()
    with torch.no_grad():
        fused.weight[3:7] *= 50.0  # the middle part much larger: one shared mean would zero the others
    x = torch.randn(2, 6, dtype=torch.float64)
    parts = fused.weight.split((3, 4, 2))
    want = torch.cat([torch.tensor([matmul(activation_reference(tok), ternary_reference(p.tolist()), None)
                                    for tok in x.tolist()], dtype=torch.float64) for p in parts], dim=-1)
    torch.testing.assert_close(fused(x), want, rtol=1e-12, atol=1e-12)


def test_the_straight_through_estimator_passes_gradients_to_the_latent_weight_and_input() -> None:
    torch.manual_seed(3)
    layer = BitLinear(in_features=8, out_features=4, bias=True).double()
    x = torch.randn(5, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(5, 4, dtype=torch.float64)
    layer(x).backward(g)
    # STE: d out / d W as if the forward were x_q @ W_q^T with W_q, x_q the identity of W, x: g^T x_q and g W_q.
    x_q = torch.tensor([activation_reference(t) for t in x.tolist()], dtype=torch.float64)
    w_q = torch.tensor(ternary_reference(layer.weight.tolist()), dtype=torch.float64)
    torch.testing.assert_close(layer.weight.grad, g.T @ x_q)
    torch.testing.assert_close(x.grad, g @ w_q)
    torch.testing.assert_close(layer.bias.grad, g.sum(0))
    assert layer.weight.grad.abs().sum() > 0


def test_a_step_of_sgd_moves_the_latent_weight_and_training_lowers_the_loss() -> None:
    torch.manual_seed(4)
    layer = BitLinear(in_features=16, out_features=16)
    target = torch.randn(16, 16)
    x = torch.randn(64, 16)
    opt = torch.optim.Adam(layer.parameters(), lr=3e-2)
    losses = []
    for _ in range(60):
        loss = (layer(x) - x @ target.T).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_bad_splits_are_refused_naming_what_is_accepted() -> None:
    with pytest.raises(ValueError, match="add up to out_features"):
        BitLinear(in_features=4, out_features=6, splits=(2, 2))
    with pytest.raises(ValueError, match="add up to out_features"):
        BitLinearParams().sized(in_features=4, out_features=6, splits=(5,))
    with pytest.raises(ValidationError):
        BitLinearParams(eps=0)


def test_sized_counts_what_the_constructor_builds() -> None:
    for bias in (False, True):
        built = BitLinear(in_features=5, out_features=6, bias=bias, splits=(2, 4))
        assert BitLinearParams().sized(in_features=5, out_features=6, bias=bias, splits=(2, 4)).parameters == \
            sum(p.numel() for p in built.parameters())


def test_attention_and_gated_mlp_name_it_and_the_sub_norms() -> None:
    """attention's linear + out_norm and the gated MLP's linear + inner_norm, against the same math written with
    BitLinear by hand (weights shared): BitNet's attn_sub_norm before o_proj and ffn_sub_norm before down_proj."""
    torch.manual_seed(5)
    spec = {"kind": "swiglu", "hidden": 12, "activation": "relu2", "linear": "bitlinear",
            "inner_norm": {"kind": "rmsnorm", "eps": 1e-5}}
    ref = resolve_component("ffn", spec, path="ffn")
    ffn = ref.make(d_model=10).double()
    assert ref.sized(d_model=10).parameters == sum(p.numel() for p in ffn.parameters())
    for p in ffn.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(2, 3, 10, dtype=torch.float64)
    gate_w, up_w = ffn.gate_up.weight.split(12)
    xq = torch.tensor([[activation_reference(t) for t in row] for row in x.tolist()], dtype=torch.float64)
    gate = xq @ torch.tensor(ternary_reference(gate_w.tolist()), dtype=torch.float64).T
    up = xq @ torch.tensor(ternary_reference(up_w.tolist()), dtype=torch.float64).T
    inner = torch.relu(gate) ** 2 * up
    inner = inner * torch.rsqrt(inner.pow(2).mean(-1, keepdim=True) + 1e-5) * ffn.inner_norm.weight
    iq = torch.tensor([[activation_reference(t) for t in row] for row in inner.tolist()], dtype=torch.float64)
    want = iq @ torch.tensor(ternary_reference(ffn.down.weight.tolist()), dtype=torch.float64).T
    torch.testing.assert_close(ffn(x), want, rtol=1e-9, atol=1e-9)

    attn_ref = resolve_component("mixer", {"kind": "attention", "n_heads": 3, "n_kv_heads": 1, "head_dim": 4,
                                           "linear": "bitlinear", "out_norm": "rmsnorm", "output_gate": True},
                                 path="mixer")
    attn = attn_ref.make(d_model=10)
    assert attn_ref.sized(d_model=10).parameters == sum(p.numel() for p in attn.parameters())
    assert isinstance(attn.qkv, BitLinear) and attn.qkv.splits == (12, 4, 4)
    assert isinstance(attn.out, BitLinear) and isinstance(attn.gate, BitLinear)
    assert attn.out_norm.weight.shape == (12,)


@pytest.mark.parametrize("bias", [False, True])
def test_equals_transformers_online_autobitlinear(bias: bool, monkeypatch) -> None:
    """transformers' AutoBitLinear (online quantization, what BitNet's quantization_config builds) on the same input."""
    pytest.importorskip("transformers")
    from transformers.integrations.bitnet import ActQuant, AutoBitLinear, WeightQuant

    for quantizer in (ActQuant, WeightQuant):  # torch.compile'd in transformers: their eager functions, here
        compiled = quantizer.__dict__["forward"].__func__
        monkeypatch.setattr(quantizer, "forward", staticmethod(compiled._torchdynamo_orig_callable))
    torch.manual_seed(3)
    theirs = AutoBitLinear(in_features=24, out_features=10, bias=bias, online_quant=True)
    ours = BitLinear(in_features=24, out_features=10, bias=bias)
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(2, 5, 24) * torch.tensor([0.1, 3.0, 1.0, 40.0, 0.5])[None, :, None]
    with torch.no_grad():
        torch.testing.assert_close(ours(x), theirs(x), rtol=1e-6, atol=1e-6)
