"""Shared blocks (``model.shared_blocks`` and ``model.layers[].shared``): one block's weights at several depths.

The model is checked against the same computation written out here (its embedding, blocks,
the one shared module applied twice, final norm, head); the weights against the state dict
and the gradient; the caches against the uncached forward; bad specs against their one line.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import specformer
from fixtures.caching import cached_logits
from fixtures.tiny import tiny_spec
from specformer.errors import SpecError
from specformer.model.summary import summarize
from specformer.spec.check import check_spec

SHARED = {"mixer": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1}, "norm": "rmsnorm",
          "ffn": {"kind": "mlp", "hidden": 24}}


def shared_spec(**changes: Any) -> dict[str, Any]:
    """Four layers; the shared block 'attn' runs before layers 1 and 3 (a recurrent backbone under it:
    layer 2 is a Mamba-2 layer, so one forward mixes keys per use with a state)."""
    return tiny_spec(n_layers=4, shared_blocks={"attn": dict(SHARED)},
                     layers=[{"select": [1, 3], "shared": "attn"},
                             {"select": 2, "mixer": {"kind": "mamba2", "n_heads": 4, "head_dim": 16, "state_size": 8,
                                                     "n_groups": 1, "chunk": 4}}],
                     **changes)


def _written_out(model: Any, ids: torch.Tensor, uses: tuple[int, ...] = (1, 3)) -> torch.Tensor:
    """embedding -> block 0 -> shared -> block 1 -> block 2 -> shared -> block 3 -> final norm -> tied head,
    with the one shared module called at both depths (each call a fresh context, no cache)."""
    from specformer.model.context import ForwardContext, default_positions

    positions = default_positions(*ids.shape, device="cpu")
    ctx = ForwardContext(positions=positions, positional=model.positional,
                         positional_state=model.positional.prepare(positions), plain_causal=True)
    shared = model.shared_blocks["attn"]
    x = model.embedding(ids)
    for index, block in enumerate(model.blocks):
        if index in uses:
            x = shared(x, ctx)
        x = block(x, ctx)
    return torch.nn.functional.linear(model.final_norm(x), model.embedding.weight)[..., : model.vocab_size]


@torch.no_grad()
def test_a_shared_block_runs_at_each_depth_that_names_it() -> None:
    model = specformer.build(shared_spec(), seed=0).double().eval()
    ids = torch.randint(0, model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(ids), _written_out(model, ids), rtol=1e-10, atol=1e-10)
    assert not torch.allclose(_written_out(model, ids, uses=()), model(ids))  # the shared block matters


def test_its_weights_are_one_tensor_stored_once_and_trained_by_every_use() -> None:
    model = specformer.build(shared_spec(), seed=0).double()
    names = [n for n in model.state_dict() if "shared" in n]
    assert names and all(n.startswith("shared_blocks.attn.") for n in names)
    assert not any(".shared" in n for n in model.state_dict() if n.startswith("blocks."))
    ids = torch.randint(0, model.vocab_size, (2, 6), generator=torch.Generator().manual_seed(2))
    weight = model.shared_blocks["attn"].mixer.qkv.weight

    def grad_of(logits: torch.Tensor) -> torch.Tensor:
        model.zero_grad()
        logits.square().mean().backward()
        return weight.grad.clone()

    both = grad_of(model(ids))
    torch.testing.assert_close(both, grad_of(_written_out(model, ids)), rtol=1e-9, atol=1e-12)
    first, second = grad_of(_written_out(model, ids, uses=(1,))), grad_of(_written_out(model, ids, uses=(3,)))
    assert first.abs().sum() > 0 and second.abs().sum() > 0  # each use alone trains the one tensor
    assert not torch.allclose(both, first) and not torch.allclose(both, second)  # and both do together


@torch.no_grad()
def test_a_checkpoint_stores_the_shared_block_once_and_loads_back_exactly(tmp_path) -> None:
    from safetensors.torch import load_file

    from specformer.checkpoint.save_load import load, save

    model = specformer.build(shared_spec(), seed=0).eval()
    save(model, tmp_path / "m.safetensors")
    stored = load_file(tmp_path / "m.safetensors")
    assert sum(t.numel() for t in stored.values()) == sum(p.numel() for p in model.parameters())
    loaded = load(tmp_path / "m.safetensors").eval()
    ids = torch.randint(0, model.vocab_size, (1, 7), generator=torch.Generator().manual_seed(4))
    assert torch.equal(loaded(ids), model(ids))


def test_the_summary_and_the_size_check_count_shared_weights_once() -> None:
    spec = shared_spec()
    model = specformer.build(spec, seed=0)
    stored = sum(p.numel() for p in model.parameters())
    shared = sum(p.numel() for p in model.shared_blocks.parameters())
    once_per_use = stored + shared  # what counting each use would give
    assert model.num_parameters() == stored
    assert summarize(model).total == stored
    assert summarize(spec).total == stored != once_per_use
    checked = check_spec(spec)
    assert checked.sizes.parameters == stored  # the torch-free size check
    assert checked.shape.parameters == stored  # the meta-device estimate


def test_the_summary_counts_compute_and_cache_once_per_use() -> None:
    """Against the same backbone without the shared block: two uses add 2x its matmuls, 2x its attention
    (2 heads x (16 + 16) x 32 keys, x2 FLOPs) and 2x its keys and values (1 kv head x 16, keys and values)."""
    spec, plain = shared_spec(), shared_spec()
    del plain["model"]["shared_blocks"], plain["model"]["layers"][0]
    model = specformer.build(spec, seed=0)
    block = model.shared_blocks["attn"]
    matmul = sum(p.numel() for n, p in block.named_parameters() if n.startswith(("mixer.", "ffn.")))
    for with_shared, without in ((summarize(spec), summarize(plain)), (summarize(model), summarize(plain))):
        assert with_shared.matmul_params - without.matmul_params == 2 * matmul
        assert with_shared.attention_flops_per_token - without.attention_flops_per_token == 2 * (2 * 2 * (16 + 16) * 32)
        assert with_shared.kv_elements_per_token - without.kv_elements_per_token == 2 * (2 * 1 * 16)
        assert with_shared.params["shared_blocks"] == sum(p.numel() for p in block.parameters())


@torch.no_grad()
def test_cached_decoding_equals_the_uncached_forward_with_a_cache_per_use() -> None:
    model = specformer.build(shared_spec(), seed=0).double().eval()
    ids = torch.randint(0, model.vocab_size, (2, 10), generator=torch.Generator().manual_seed(3))
    logits, cache = cached_logits(model, ids, prompt=4)
    torch.testing.assert_close(logits, model(ids), rtol=1e-9, atol=1e-9)
    uses = [m.layer_index for m in model.attention_modules()[4:]]
    assert uses == [4, 5]  # one slot per use, after the four layers


def test_a_reference_to_an_unknown_shared_block_is_one_clear_error() -> None:
    spec = shared_spec()
    spec["model"]["layers"][0]["shared"] = "atn"
    with pytest.raises(SpecError) as err:
        specformer.build(spec)
    assert [p.path for p in err.value.problems] == ["model.layers[0].shared"]
    message = err.value.problems[0].message
    assert "unknown shared block 'atn'" in message and "did you mean 'attn'" in message


def test_an_unused_shared_block_and_one_without_definitions_are_refused() -> None:
    unused = tiny_spec(shared_blocks={"attn": dict(SHARED)})
    with pytest.raises(SpecError, match="run by no layer") as err:
        specformer.build(unused)
    assert [p.path for p in err.value.problems] == ["model.shared_blocks.attn"]
    undefined = tiny_spec(layers=[{"select": 1, "shared": "attn"}])
    with pytest.raises(SpecError, match="model.shared_blocks defines none"):
        specformer.build(undefined)


def test_a_shared_block_before_the_first_cached_layer_is_refused() -> None:
    spec = shared_spec()
    spec["model"]["layers"][0]["select"] = [0, 3]
    with pytest.raises(SpecError, match="before the first layer that keeps a cache"):
        specformer.build(spec)
