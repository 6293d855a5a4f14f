"""The builder: every example spec builds and trains a step; the built model equals hand-written ones."""

from __future__ import annotations

import copy

import pytest
import torch

import specformer
from specformer.spec import layer_selection, read_spec_file

from conftest import SPECS
from fixtures.handwritten import GPT2, Llama, copy_weights_from, gpt2_spec, llama_spec
from fixtures.small_parts import run_shared_blocks, small_mixers

SPEC_FILES = sorted(p for p in SPECS.iterdir() if p.suffix in (".yaml", ".yml", ".json", ".toml"))


def shrink(data: dict, *, d_model: int = 64, n_layers: int = 2, vocab: int = 128) -> dict:
    """The same architecture at a size a test can run: fewer, narrower layers and a small vocab."""
    data = copy.deepcopy(data)
    m = data["model"]
    scale = d_model / m["d_model"]
    m.update(d_model=d_model, n_layers=min(m["n_layers"], n_layers), vocab_size=min(m["vocab_size"], vocab),
             context_length=min(m["context_length"], 64))
    m["layers"] = [o for o in m.get("layers", []) if _selects_some(o.get("select"), m["n_layers"])]
    run_shared_blocks(m)
    small_mixers(m)
    ffn = m["block"]["ffn"]
    if isinstance(ffn, dict) and ffn.get("hidden"):
        ffn["hidden"] = max(8, int(ffn["hidden"] * scale))
    return data


def _selects_some(select: object, n_layers: int) -> bool:
    """Overrides of layers a shrunk model no longer has are dropped (Gemma 3's '5::6' of 2 layers)."""
    try:
        return bool(layer_selection(select, n_layers))
    except ValueError:
        return False


@pytest.mark.parametrize("path", SPEC_FILES, ids=lambda p: p.name)
def test_every_example_spec_validates_builds_and_trains_a_step(path):
    full = specformer.load_spec(path)  # at its real size: validation builds on the meta device
    assert full.model.n_layers >= 1
    model = specformer.build(shrink(read_spec_file(path)), seed=0)
    x = torch.randint(0, model.vocab_size, (2, 16))
    logits = model(x)
    assert logits.shape == (2, 16, model.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), x.flatten())
    auxiliary = model.auxiliary_loss()  # what training adds: routers' balance, an indexer's alignment
    if auxiliary is not None:
        loss = loss + auxiliary
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in model.parameters())


def test_model_carries_its_spec(fresh_tiny_spec):
    model = specformer.build(fresh_tiny_spec)
    assert model.spec.to_dict() == specformer.load_spec(fresh_tiny_spec).to_dict()


def test_seed_makes_init_deterministic(fresh_tiny_spec):
    a, b = specformer.build(fresh_tiny_spec, seed=3), specformer.build(fresh_tiny_spec, seed=3)
    c = specformer.build(fresh_tiny_spec, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.embedding.weight, c.embedding.weight)


def test_build_does_not_disturb_the_global_rng(fresh_tiny_spec):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    specformer.build(fresh_tiny_spec, seed=1)
    assert torch.equal(torch.rand(3), expected)


def test_scaled_residual_init(fresh_tiny_spec):
    fresh_tiny_spec["model"].update(d_model=256, n_layers=8)
    fresh_tiny_spec["model"]["block"]["ffn"]["hidden"] = 512
    model = specformer.build(fresh_tiny_spec, seed=0)
    std = model.spec.model.init_std
    block = model.blocks[0]
    assert block.mixer.qkv.weight.std().item() == pytest.approx(std, rel=0.05)
    assert block.mixer.out.weight.std().item() == pytest.approx(std / (2 * 8) ** 0.5, rel=0.05)
    assert block.ffn.down.weight.std().item() == pytest.approx(std / (2 * 8) ** 0.5, rel=0.05)
    assert torch.equal(block.attention_norm.weight, torch.ones(256))


def test_per_layer_overrides_reach_the_modules(fresh_tiny_spec):
    fresh_tiny_spec["model"]["n_layers"] = 4
    fresh_tiny_spec["model"]["layers"] = [{"select": "1::2", "mixer": {"window": 4}}]
    model = specformer.build(fresh_tiny_spec)
    assert [a.window for a in model.attention_modules()] == [None, 4, None, 4]


def test_build_on_meta_allocates_nothing():
    model = specformer.build(SPECS / "llama-3.2-1b.yaml", device="meta")
    assert model.num_parameters() == 1_235_814_400
    assert all(p.is_meta for p in model.parameters())


def test_dtype_argument(fresh_tiny_spec):
    model = specformer.build(fresh_tiny_spec, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model(torch.zeros(1, 4, dtype=torch.long)).dtype == torch.bfloat16


def test_gpt2_logits_equal_a_hand_written_gpt2():
    sizes = dict(vocab=101, d=64, n_layers=2, n_heads=4, context=32)
    ours = specformer.build(gpt2_spec(**sizes), seed=0)
    peer = copy_weights_from(ours, GPT2(**sizes))
    x = torch.randint(0, 101, (3, 32))
    torch.testing.assert_close(ours(x), peer(x), rtol=0, atol=1e-5)


def test_llama_logits_equal_a_hand_written_llama():
    sizes = dict(vocab=101, d=64, n_layers=2, n_heads=8, n_kv=2, hidden=96)
    ours = specformer.build(llama_spec(**sizes, context=32), seed=0)
    for p in ours.parameters():  # non-trivial norm weights
        if p.dim() == 1:
            torch.nn.init.uniform_(p, 0.5, 1.5)
    peer = copy_weights_from(ours, Llama(**sizes))
    x = torch.randint(0, 101, (3, 32))
    torch.testing.assert_close(ours(x), peer(x), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["learned", "sinusoidal"])
def test_sequence_longer_than_context_is_refused_by_positions_that_end_there(fresh_tiny_spec, kind):
    fresh_tiny_spec["model"]["positional"] = {"kind": kind}
    model = specformer.build(fresh_tiny_spec)
    with pytest.raises(ValueError, match=f"longer than the context length 32 \\(its {type(model.positional).__name__} "
                                         "has no position past it\\); give at most 32 tokens"):
        model(torch.zeros(1, 33, dtype=torch.long))


@pytest.mark.parametrize("positional, warns", [({"kind": "rope"}, True), ({"kind": "alibi"}, False),
                                               ({"kind": "none"}, False),
                                               ({"kind": "rope", "scaling": {"kind": "dynamic", "factor": 2.0}}, False)])
def test_sequence_longer_than_context_runs_where_the_positions_allow_it(fresh_tiny_spec, positional, warns):
    """Decoder.past_context's policy, as generation applies it: "warn" warns once per model, "yes" says nothing."""
    import warnings

    fresh_tiny_spec["model"]["positional"] = positional
    model = specformer.build(fresh_tiny_spec, seed=0).eval()
    ids = torch.randint(0, 97, (2, 40), generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            long, again = model(ids), model(ids)
    said = [str(w.message) for w in caught]
    assert said == (["a sequence of 40 tokens, past the model's context length of 32: its positions (RotaryPositions) "
                     "were never trained there, so quality may drop"] if warns else [])
    assert long.shape == (2, 40, 97) and torch.equal(long, again)
    with torch.no_grad():  # the same as giving the positions explicitly, which never was refused
        assert torch.equal(long, model(ids, positions=torch.arange(40).expand(2, 40)))
        if "scaling" not in positional:  # causal, so a prefix agrees (dynamic scaling's theta follows the length)
            torch.testing.assert_close(long[:, :32], model(ids[:, :32]), rtol=0, atol=1e-5)


def test_build_resolves_sizes_and_assembles_once(fresh_tiny_spec, monkeypatch):
    import specformer.model.builder
    import specformer.model.sizes
    import specformer.spec.validate

    calls = {"resolve": 0, "size check": 0, "assemble": 0}

    def counting(name, real):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(specformer.spec.validate, "resolve_model", counting("resolve", specformer.spec.validate.resolve_model))
    monkeypatch.setattr(specformer.model.sizes, "estimate_resolved", counting("size check", specformer.model.sizes.estimate_resolved))
    monkeypatch.setattr(specformer.model.builder, "assemble", counting("assemble", specformer.model.builder.assemble))
    fresh_tiny_spec["model"]["n_layers"] = 3
    fresh_tiny_spec["model"]["layers"] = [{"select": 1, "mixer": {"window": 4}}]  # two distinct blocks
    model = specformer.build(fresh_tiny_spec)
    assert calls == {"resolve": 1, "size check": 1, "assemble": 1}
    assert len(model.blocks) == 3


@pytest.mark.parametrize("positional", ["rope", {"kind": "rope", "scaling": {"kind": "llama3", "factor": 8}},
                                        "alibi", "sinusoidal", "learned", "none"], ids=str)
def test_build_without_init_materialises_once_and_loads_exactly(fresh_tiny_spec, monkeypatch, positional):
    fresh_tiny_spec["model"]["positional"] = positional
    reference = specformer.build(fresh_tiny_spec, seed=0)
    inits = []
    monkeypatch.setattr(specformer.Decoder, "init_weights", lambda self, **kw: inits.append(1))
    bare = specformer.build(fresh_tiny_spec, init=False)
    assert inits == []  # nothing initialised that the stored tensors then overwrite
    assert all(not p.is_meta for p in bare.parameters()) and all(not b.is_meta for b in bare.buffers())
    # The derived tables (not in the state dict) are recomputed, equal to a normal build's.
    persistent = set(reference.state_dict())
    tables = {n: b for n, b in reference.named_buffers() if n not in persistent}
    for name, table in tables.items():
        assert torch.equal(dict(bare.named_buffers())[name], table), name
    bare.load_state_dict(reference.state_dict(), strict=True)
    x = torch.randint(0, reference.vocab_size, (2, 8))
    assert torch.equal(bare(x), reference(x))
    assert bare.spec.to_dict() == reference.spec.to_dict()
