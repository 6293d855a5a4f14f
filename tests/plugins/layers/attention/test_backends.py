"""Every attention backend against the eager reference, for every option, mask and positional scheme.

``eager`` is the written-out softmax; ``sdpa`` and ``auto`` must equal it in values and
gradients (fp32, 1e-5). ``flex`` is checked two ways: its mask_mod/score_mod/sink slot
through PyTorch's reference (uncompiled) FlexAttention in the fast suite, and the
compiled, block-sparse kernel itself (so the block masks too) on one fast case and all
of them in the slow suite. PyTorch has no CPU backward for FlexAttention, so on CPU
flex is compared on values; with gradients it falls back to the dense path (checked).
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import torch

from specformer.model.masks import MaskRule
from specformer_layers.attention import flex, kernels, tiled
from specformer_layers.attention.causal import CausalSelfAttention
from specformer_layers.attention.params import CausalSelfAttentionParams
from specformer_layers.positional.alibi import ALiBi
from specformer_layers.positional.rope import RotaryPositions

from ..support import ListCache, context

D_MODEL, N_HEADS, N_KV = 32, 4, 2

#: Attention options, each alone and some together.
OPTIONS = {
    "plain": {},
    "window": {"window": 5},
    "chunk": {"chunk": 4},
    "softcap": {"logit_softcap": 2.0},
    "sinks": {"sinks": True},
    "window+sinks+softcap": {"window": 3, "sinks": True, "logit_softcap": 3.0},
    "chunk+window": {"chunk": 6, "window": 4},
}
SCHEMES = {"none": None, "rope": lambda: RotaryPositions(head_dim=D_MODEL // N_HEADS, context_length=64), "alibi": lambda: ALiBi(n_heads=N_HEADS)}


def make(backend: str, seed: int = 0, **options) -> CausalSelfAttention:
    torch.manual_seed(seed)
    params = CausalSelfAttentionParams(n_heads=N_HEADS, n_kv_heads=N_KV, backend=backend, **options)
    attention = CausalSelfAttention(params, d_model=D_MODEL)
    attention.init_weights(std=0.1, residual_std=0.1)
    if attention.sinks is not None:
        torch.nn.init.normal_(attention.sinks, std=1.0)  # sinks that matter
    return attention


def scheme(name: str):
    return None if SCHEMES[name] is None else SCHEMES[name]()


def run(attention: CausalSelfAttention, x: torch.Tensor, positions: torch.Tensor, positional=None, *,
        document_ids=None, plain_causal=False):
    ctx = context(positions, positional, plain_causal=plain_causal)
    ctx.document_ids = document_ids
    return attention(x, ctx)


def inputs(batch: int = 2, length: int = 11, seed: int = 1):
    torch.manual_seed(seed)
    return torch.randn(batch, length, D_MODEL)


def padded_positions(batch: int, length: int) -> torch.Tensor:
    positions = torch.arange(length).expand(batch, length).clone()
    positions[1] = torch.arange(length) - 3  # row 1 left-padded by three
    positions[1, :3] = -1
    return positions


DOCUMENTS = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2], [5, 5, 5, 5, 5, 5, 7, 7, 7, 7, 7]])


def reset(documents: torch.Tensor) -> torch.Tensor:
    """Positions restarting at 0 at each document's first token."""
    positions = torch.zeros_like(documents)
    for row in range(documents.shape[0]):
        for t in range(1, documents.shape[1]):
            same = documents[row, t] == documents[row, t - 1]
            positions[row, t] = positions[row, t - 1] + 1 if same else 0
    return positions


CASES = {
    "causal": lambda: dict(positions=torch.arange(11).expand(2, 11), plain_causal=True),
    "padded": lambda: dict(positions=padded_positions(2, 11)),
    "documents": lambda: dict(positions=reset(DOCUMENTS), document_ids=DOCUMENTS),
}


def close(got: torch.Tensor, want: torch.Tensor) -> bool:
    """Equal to 1e-5 of the larger of 1 and the reference's magnitude (weight gradients reach ~10)."""
    return bool((got - want).abs().max() <= 1e-5 * max(1.0, want.abs().max().item()))


def compare(backend: str, option: str, scheme_name: str, case: str, *, grads: bool) -> None:
    x = inputs()
    kwargs = CASES[case]()
    ref_x, got_x = x.clone().requires_grad_(grads), x.clone().requires_grad_(grads)
    reference, candidate = make("eager", **OPTIONS[option]), make(backend, **OPTIONS[option])
    positional = scheme(scheme_name)
    want = run(reference, ref_x, positional=positional, **kwargs)
    got = run(candidate, got_x, positional=positional, **kwargs)
    real = kwargs["positions"] >= 0  # padded rows' outputs are never used
    assert torch.allclose(got[real], want[real], atol=1e-5, rtol=1e-5), (got - want)[real].abs().max()
    if grads:
        weight = torch.randn_like(want)
        (want * weight)[real].sum().backward()
        (got * weight)[real].sum().backward()
        assert close(got_x.grad, ref_x.grad)
        for (name, p), (_, q) in zip(reference.named_parameters(), candidate.named_parameters()):
            assert close(q.grad, p.grad), name


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_equals_eager_values_and_gradients(option, scheme_name, case) -> None:
    compare("sdpa", option, scheme_name, case, grads=True)


@pytest.mark.parametrize("option", ["plain", "window", "sinks", "softcap"])
@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("case", list(CASES))
def test_auto_equals_eager_values_and_gradients(option, scheme_name, case) -> None:
    compare("auto", option, scheme_name, case, grads=True)


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("case", list(CASES))
def test_tiled_equals_eager_values_and_gradients(monkeypatch, option, scheme_name, case) -> None:
    """auto on CPU with gradients and inputs longer than a tile: the dense kernels on query tiles."""
    monkeypatch.setattr(tiled, "TILE", 4)  # 11 tokens: three tiles, the last one ragged
    monkeypatch.setattr(kernels, "TILED_MAX_COVER", 1.0)  # tiles even where they save little
    compare("auto", option, scheme_name, case, grads=True)


def test_auto_tiles_only_where_the_tiles_skip_most_scores(monkeypatch) -> None:
    monkeypatch.setattr(tiled, "TILE", 4)
    positions = torch.arange(32).expand(1, 32)
    assert tiled.covered(context(positions), positions, MaskRule(window=4)) < 0.5  # tiled
    assert tiled.covered(context(positions), positions, MaskRule()) > 0.5  # plain causal + bias: dense
    calls = []
    monkeypatch.setattr(tiled, "tiled", lambda *a, **k: calls.append(1) or torch.zeros(1, N_HEADS, 32, 8))
    x = inputs(batch=1, length=32).requires_grad_()
    make("auto", window=4)(x, context(positions))
    assert calls == [1]
    make("auto")(x, context(positions, ALiBi(n_heads=N_HEADS)))
    assert calls == [1]  # ALiBi over the full causal triangle: the dense path


def test_tiles_read_only_the_keys_their_rows_may_read(monkeypatch) -> None:
    monkeypatch.setattr(tiled, "TILE", 4)
    positions = torch.arange(16).expand(1, 16)
    ctx = context(positions)
    assert tiled.spans(ctx, positions, MaskRule(window=3)) == [(0, 4, 0, 4), (4, 8, 0, 8), (8, 12, 4, 12),
                                                                (12, 16, 8, 16)]
    ctx.document_ids = torch.tensor([[0] * 6 + [1] * 10])
    assert tiled.spans(ctx, positions, MaskRule()) == [(0, 4, 0, 4), (4, 8, 0, 8), (8, 12, 4, 12), (12, 16, 4, 16)]
    with torch.enable_grad():
        x = inputs(batch=1, length=16).requires_grad_()
        attention = make("auto", window=3)
        assert kernels.plan("auto", ctx=ctx, q=torch.zeros(1, 4, 16, 8, requires_grad=True),
                            k=torch.zeros(1, 2, 16, 8), v=torch.zeros(1, 2, 16, 8), k_positions=positions,
                            rule=attention.mask_rule, scores=kernels.Scores(scale=1.0), dropout=0.0,
                            observed=False).kernel == "tiled"
        attention(x, ctx).sum().backward()


@pytest.fixture
def reference_flex(monkeypatch):
    """FlexAttention uncompiled: PyTorch's reference of the same mask_mod and score_mod (fast, materialises)."""
    monkeypatch.setattr(flex, "_kernel", lambda: flex._flex_attention)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*flex_attention called without torch.compile.*")
        yield


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("case", list(CASES))
def test_flex_score_and_mask_mods_equal_eager(reference_flex, option, scheme_name, case) -> None:
    with torch.no_grad():
        compare("flex", option, scheme_name, case, grads=False)


def test_flex_compiled_kernel_equals_eager() -> None:
    """The compiled block-sparse kernel on one mixed case (window, documents, padding-free, ALiBi)."""
    with torch.no_grad():
        compare("flex", "window", "alibi", "documents", grads=False)


@pytest.mark.slow
@pytest.mark.parametrize("option,scheme_name,case", [
    ("chunk", "rope", "padded"), ("window+sinks+softcap", "alibi", "padded"), ("chunk+window", "none", "documents"),
    ("sinks", "rope", "causal"), ("softcap", "alibi", "causal"),
])
def test_flex_compiled_kernel_equals_eager_slow(option, scheme_name, case) -> None:
    with torch.no_grad():
        compare("flex", option, scheme_name, case, grads=False)


def test_flex_with_gradients_on_cpu_falls_back_to_the_dense_path_with_one_warning(monkeypatch) -> None:
    monkeypatch.setattr(kernels, "_warned", set())
    # Whether this machine compiles FlexAttention at all (an earlier test found out) is beside the
    # point: where Inductor cannot (no C compiler; PyTorch's `default` CPU kernels) that reason
    # would be the one given.
    monkeypatch.setattr(flex, "_broken", None)
    with pytest.warns(RuntimeWarning, match="no backward on cpu"):
        compare("flex", "window", "alibi", "documents", grads=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compare("flex", "chunk", "none", "padded", grads=True)  # same reason: no second warning


def test_a_failed_compile_falls_back_to_dense_with_one_warning(monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("no C compiler found")

    monkeypatch.setattr(flex, "_kernel", lambda: broken)
    monkeypatch.setattr(flex, "_broken", None)
    monkeypatch.setattr(kernels, "_warned", set())
    with torch.no_grad():
        with pytest.warns(RuntimeWarning, match="could not be compiled.*no C compiler found"):
            compare("flex", "window", "none", "padded", grads=False)
        with pytest.warns(RuntimeWarning, match="backend flex: FlexAttention could not be compiled"):
            compare("flex", "chunk", "none", "padded", grads=False)  # the explicit request says so once
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compare("flex", "chunk", "rope", "padded", grads=False)
            compare("auto", "chunk", "rope", "padded", grads=False)


@pytest.mark.parametrize("option", ["window", "chunk", "window+sinks+softcap"])
def test_cached_decoding_equals_eager_on_every_backend(reference_flex, option) -> None:
    """Prefill then one token at a time through a cache, each backend against eager recompute."""
    x = inputs(batch=2, length=9)
    positions = padded_positions(2, 9)
    positional = RotaryPositions(head_dim=D_MODEL // N_HEADS, context_length=64)
    want = run(make("eager", **OPTIONS[option]), x, positions, positional).detach()
    for backend in ("sdpa", "auto", "flex"):
        attention, cache = make(backend, **OPTIONS[option]), ListCache()
        with torch.no_grad():
            outs = [attention(x[:, :5], context(positions[:, :5], positional, cache=cache))]
            for t in range(5, 9):
                outs.append(attention(x[:, t:t + 1], context(positions[:, t:t + 1], positional, cache=cache)))
        got = torch.cat(outs, dim=1)
        real = positions >= 0
        assert torch.allclose(got[real], want[real], atol=1e-5), backend


def test_summary_names_the_kernel_of_each_option() -> None:
    rows = {name: make("auto", **opts).describe_kernel() for name, opts in itertools.islice(OPTIONS.items(), 5)}
    assert rows["plain"].startswith("sdpa (fused causal)")
    assert "flex" in rows["window"] and "flex" in rows["sinks"]
    assert kernels.describe(backend="eager") == "eager"
    assert kernels.describe(backend="auto", rule=MaskRule(window=4)) == "flex; tiled sdpa dense mask for CPU training"


#: Each situation describe() speaks of, as a real call: positions, whether gradients are on, length.
SITUATION_CALLS = {
    "": dict(positions=torch.arange(32).expand(2, 32), plain_causal=True, grads=False),
    "padded, packed or cached input": dict(positions=padded_positions(2, 32), plain_causal=False, grads=False),
    "CPU training": dict(positions=torch.arange(32).expand(2, 32), plain_causal=True, grads=True),
}


@pytest.mark.parametrize("backend", kernels.BACKENDS)
@pytest.mark.parametrize("scheme_name", ["none", "alibi"])
def test_the_summary_names_the_kernel_each_situation_really_takes(monkeypatch, backend, scheme_name) -> None:
    """describe() is plan() asked about typical inputs: a real call in each situation takes the kernel it names."""
    monkeypatch.setattr(flex, "flex_attention", lambda q, *a, **k: torch.zeros_like(q))  # which kernel, not its values
    monkeypatch.setattr(tiled, "TILE", 4)  # 32 tokens: eight tiles, so a window skips most of them
    monkeypatch.setattr(kernels, "FLEX_MIN_SCORES", 0)  # "on an accelerator": FlexAttention pays at any size
    monkeypatch.setattr(flex, "_broken", None)
    monkeypatch.setattr(kernels, "_warned", set())
    taken: list[kernels.Plan] = []
    real_plan = kernels.plan
    monkeypatch.setattr(kernels, "plan", lambda *a, **k: taken.append(real_plan(*a, **k)) or taken[-1])
    for option, opts in OPTIONS.items():
        attention = make(backend, **opts)
        named = kernels.situation_plans(backend=backend, rule=attention.mask_rule, logit_softcap=attention.logit_softcap,
                                        sinks=attention.sinks is not None, bias=scheme_name == "alibi")
        for label, want in named:
            call = SITUATION_CALLS[label]
            x = inputs(batch=2, length=32).requires_grad_(call["grads"])
            with torch.set_grad_enabled(call["grads"]), warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # backend flex on CPU training: warned once
                run(attention, x, call["positions"], scheme(scheme_name), plain_causal=call["plain_causal"])
            got = taken[-1]
            assert (got.kernel, got.dense, got.fell_back is None) == (want.kernel, want.dense, want.fell_back is None), \
                (option, label, got, want)
        assert attention.describe_kernel(bias=scheme_name == "alibi") == kernels.describe(
            backend=backend, rule=attention.mask_rule, logit_softcap=attention.logit_softcap,
            sinks=attention.sinks is not None, bias=scheme_name == "alibi")


def test_specformer_summary_prints_each_layers_kernel() -> None:
    from specformer.model.summary import format_summary, summarize

    from ..support import tiny_spec_over_vocab

    spec = tiny_spec_over_vocab(n_layers=3, layers=[{"select": "0::2", "mixer": {"window": 8}}])
    text = format_summary(summarize(spec))
    assert "attention kernel               flex; tiled sdpa dense mask for CPU training  (2 layers)" in text
    assert "attention kernel               sdpa (fused causal); flex for padded, packed or cached input  (1 layer)" in text


# -- whole models: per-layer mixes and packed documents -----------------------------------------


def mixed_model(backend: str, positional: dict):
    from specformer.model.builder import build

    from ..support import tiny_spec_over_vocab

    spec = tiny_spec_over_vocab(n_layers=4, context_length=64, positional=positional, layers=[
        {"select": "0::2", "mixer": {"window": 3, "logit_softcap": 20.0}},
        {"select": "1", "mixer": {"chunk": 4, "sinks": True}},
    ])
    spec["model"]["block"]["mixer"]["backend"] = backend
    return build(spec, seed=0)


@pytest.mark.parametrize("positional", [{"kind": "rope"}, {"kind": "alibi"}, {"kind": "learned"}])
def test_per_layer_mixes_equal_eager_on_every_backend_with_packed_documents(reference_flex, positional) -> None:
    torch.manual_seed(0)
    ids = torch.randint(0, 61, (2, 11))
    want = mixed_model("eager", positional)(ids, positions=reset(DOCUMENTS), document_ids=DOCUMENTS)
    for backend in ("sdpa", "auto"):
        got = mixed_model(backend, positional)(ids, positions=reset(DOCUMENTS), document_ids=DOCUMENTS)
        assert close(got, want), backend
    with torch.no_grad():
        got = mixed_model("flex", positional)(ids, positions=reset(DOCUMENTS), document_ids=DOCUMENTS)
    assert close(got, want)


@pytest.mark.parametrize("backend", ["eager", "sdpa", "auto"])
def test_a_packed_row_gives_each_documents_logits_alone(backend) -> None:
    """With document ids and restarting positions, every document's logits are those it has alone."""
    model = mixed_model(backend, {"kind": "rope"})
    torch.manual_seed(1)
    ids = torch.randint(0, 61, (2, 11))
    packed = model(ids, positions=reset(DOCUMENTS), document_ids=DOCUMENTS)
    unmasked = model(ids, positions=reset(DOCUMENTS))
    for row in range(2):
        for doc in DOCUMENTS[row].unique():
            columns = (DOCUMENTS[row] == doc).nonzero().flatten()
            alone = model(ids[row:row + 1, columns])[0]
            assert close(packed[row, columns], alone)
    assert not close(unmasked, packed)  # without the ids the documents see each other (the test can fail)


def test_document_ids_are_checked() -> None:
    model = mixed_model("auto", {"kind": "rope"})
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"document_ids must have the shape of input_ids \(2, 5\)"):
        model(ids, document_ids=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="document_ids must be an integer tensor"):
        model(ids, document_ids=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="without a cache"):
        model(ids, positions=torch.zeros(2, 5, dtype=torch.long), document_ids=torch.zeros(2, 5, dtype=torch.long),
              cache=ListCache())
