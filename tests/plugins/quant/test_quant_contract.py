"""Every registered attention and FFN (MoE included) component, quantized: logits stay near float32.

Tolerances (relative to the largest float32 logit, model with init_std 0.02):
int8 4% (its CPU kernel quantizes activations to 7 bits per row), int4 (group 32) 20%, bf16 1%. The int4 bound is loose because a random model's
weights have no structure for 4 bits to keep; the perplexity test measures int4 on a
trained model.
"""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.errors import SpecError
from specformer.registry.discovery import get_registry
from specformer_quant import quantize, weight_bytes
from specformer_quant.weights import QuantizedLinear, QuantizedWeight

from fixtures.tiny import tiny_spec

TOLERANCE = {"int8": 0.04, "int4": 0.2, "bf16": 0.01}


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest (tests/conftest.py)


def spec(**block) -> dict:
    return tiny_spec(vocab_size=97, d_model=64, tie_embeddings=False,
                     block={"ffn": {"kind": "swiglu", "hidden": 128}, **block})


#: Components whose params differ from the default attention's or ffn's (the rest keep those sizes).
OWN_PARAMS = {
    ("mixer", "mla"): {"n_heads": 4, "kv_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
                           "v_head_dim": 16, "q_lora_rank": 32},
}


def build_or_skip(data: dict):
    try:
        return specformer.build(data, seed=0).eval()
    except SpecError as exc:
        pytest.skip(f"needs params beyond the defaults: {exc}")


def cases() -> list:
    registry = get_registry()
    out = [("mixer", name) for name in registry.names("mixer")]
    out += [("ffn", name) for name in registry.names("ffn")]
    return out


@pytest.mark.parametrize("kind, name", cases())
def test_quantized_logits_stay_close_for_every_component(kind: str, name: str) -> None:
    data = spec()
    if (kind, name) in OWN_PARAMS:
        data["model"]["block"][kind] = {"kind": name, **OWN_PARAMS[kind, name]}
    else:
        data["model"]["block"][kind] = {**data["model"]["block"][kind], "kind": name}  # the defaults' sizes kept
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    reference = build_or_skip(data)
    with torch.no_grad():
        expected = reference(ids)
    scale = float(expected.abs().max())
    for scheme, tolerance in TOLERANCE.items():
        model = build_or_skip(data)
        recipe = quantize(model, scheme)
        # Convolution taps (cca's conv_weight and group_weight) are no projections: quantisation keeps them float.
        floats = [n for n, p in model.named_parameters() if p.dim() >= 2 and "embedding" not in n
                  and n != "lm_head.weight" and "router" not in n and "shared_gate" not in n
                  and not n.endswith(("conv_weight", "group_weight"))]
        assert floats == [], f"{scheme}: weights left in float: {floats}"  # every matrix and expert stack
        assert recipe["linears"] or recipe["stacks"]
        with torch.no_grad():
            got = model(ids)
        error = float((got - expected).abs().max()) / scale
        assert error < tolerance, f"{name} {scheme}: relative logit error {error:.4f} >= {tolerance}"
        assert error > 0  # something was actually quantized


def test_moe_experts_are_quantized_and_shrink() -> None:
    model = build_or_skip(spec(ffn={"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 64}))
    before = weight_bytes(model)
    recipe = quantize(model, "int8")
    assert any(s.endswith("experts_in") for s in recipe["stacks"]) and any(s.endswith("experts_out") for s in recipe["stacks"])
    assert isinstance(model.blocks[0].ffn.experts_in, QuantizedWeight)
    assert weight_bytes(model) < 0.55 * before  # embeddings and head stay float32
    assert isinstance(model.blocks[0].mixer.qkv, QuantizedLinear)


def test_int4_dequantizes_to_the_formula() -> None:
    """Group-wise asymmetric 4-bit, written out independently: q = round((w - min) / s), s = (max - min) / 15."""
    from specformer_quant.int4 import Int4Weight

    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    q = Int4Weight.from_float(w, group_size=32)
    g = w.view(8, 2, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    s = (hi - lo) / 15
    expected = (((g - lo) / s).round() * s + lo).view(8, 64)
    torch.testing.assert_close(q.dequantize(), expected, atol=1e-6, rtol=0)
    x = torch.randn(3, 64)
    torch.testing.assert_close(q.matmul(x), x @ expected.T, atol=0.05, rtol=0.02)  # bf16 kernel activations


def test_int8_per_channel_formula_and_kernel() -> None:
    from specformer_quant.int8 import Int8Weight

    w = torch.randn(16, 32, generator=torch.Generator().manual_seed(2))
    q = Int8Weight.from_float(w)
    s = w.abs().amax(1, keepdim=True) / 127
    torch.testing.assert_close(q.dequantize(), (w / s).round() * s, atol=1e-6, rtol=0)
    x = torch.randn(4, 32)
    exact = x @ q.dequantize().T
    assert float((q.matmul(x) - exact).abs().max()) < 0.03 * float(exact.abs().max())  # 7-bit activations in the kernel


def test_int8_kernel_scales_each_row_alone() -> None:
    """The default int8 CPU kernel quantizes activations per row: a row multiplied next to rows 1000x larger or
    smaller gives bit for bit what it gives alone, and its error stays that of a row alone (7-bit activations
    and int8 weights: under 3% of the row's largest output). One scale per call (dynamic_activations) would
    round the small row to nearly nothing."""
    from specformer_quant.int8 import Int8Weight

    g = torch.Generator().manual_seed(3)
    w = Int8Weight.from_float(torch.randn(48, 64, generator=g))
    per_call = Int8Weight.from_float(w.dequantize(), dynamic_activations=True)
    x = torch.randn(5, 64, generator=g) * torch.tensor([[1.0], [1000.0], [1e-3], [5.0], [0.0]])  # (M, K)
    together = w.matmul(x)
    alone = torch.cat([w.matmul(x[i : i + 1]) for i in range(5)])
    assert torch.equal(together, alone)
    assert torch.equal(w.matmul(x[:2].view(1, 2, 64)), together[:2].view(1, 2, 48))  # leading dims kept
    exact = x @ w.dequantize().T
    for i in range(4):
        assert float((together[i] - exact[i]).abs().max()) < 0.03 * float(exact[i].abs().max()), f"row {i}"
    assert float(together[4].abs().max()) == 0.0
    small_per_call = per_call.matmul(x)[2]
    assert float((small_per_call - exact[2]).abs().max()) > 0.2 * float(exact[2].abs().max())


def test_int8_scratch_buffer_path_equals_the_allocating_path() -> None:
    """Calls of at most ``SCRATCH_ROWS`` rows write into a reused per-thread buffer instead of concatenating:
    the same bits as the allocating path taken by larger calls, and an earlier result is not overwritten."""
    from specformer_quant.int8 import SCRATCH_ROWS, Int8Weight

    g = torch.Generator().manual_seed(4)
    w = Int8Weight.from_float(torch.randn(40, 64, generator=g))
    x = torch.randn(SCRATCH_ROWS + 3, 64, generator=g)  # (M, K): more rows than the scratch path takes
    large = w.matmul(x)
    first = w.matmul(x[:2])
    second = w.matmul(x[5:7])  # same row count: the same buffer is written again
    assert torch.equal(first, large[:2])
    assert torch.equal(second, large[5:7])
    assert torch.equal(w.matmul(x[:SCRATCH_ROWS]), large[:SCRATCH_ROWS])
    with torch.inference_mode():  # generate's mode: the buffer made here is written again outside it
        assert torch.equal(w.matmul(x[7:10]), large[7:10])
    assert torch.equal(w.matmul(x[10:13]), large[10:13])
    grad_input = x[:3].clone().requires_grad_()  # autograd cannot go through out=: the allocating path
    assert torch.equal(w.matmul(grad_input).detach(), large[:3])


@pytest.mark.parametrize("scheme", ["int8", {"kind": "int4", "group_size": 32}, "bf16"])
def test_quantized_rows_do_not_depend_on_each_other(scheme) -> None:
    """Batched equals alone, and speculative greedy equals plain greedy, on a quantized model (default kernels).

    int8's ``dynamic_activations: true`` would fail this (one activation scale per call), so it is opt-in.
    """
    from specformer_generate import generate

    data = spec()
    data["model"]["init_std"] = 0.4  # a model whose greedy output varies (see the generate tests' TINY)
    model = build_or_skip(data)
    quantize(model, scheme)
    prompts = [[1, 2, 3, 4, 5, 6, 1, 2, 3, 4], [7, 8, 9], [11, 12, 11, 12, 11]]
    plain = generate(model, prompts, max_new_tokens=16)
    assert len({t for row in plain for t in row[10:]}) > 3
    assert [generate(model, [p], max_new_tokens=16)[0] for p in prompts] == plain
    assert generate(model, prompts, max_new_tokens=16, draft="ngram", draft_tokens=3) == plain
