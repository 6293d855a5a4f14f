"""What each use of a shared block has of its own (``model.shared_blocks.<name>.output / projection / adapters``).

Zamba's hybrid layer: a shared transformer's output (no residual inside it), times a projection of
that use's own, is added to the next layer's mixer input only, and Zamba2 adds low-rank adapters of
each use's own to the shared q/k/v and gate_up maps. The model is checked against that computation
written out here: each use's adapters merged into a copy of the shared block (``W + B A`` per piece of
the rows), the layer's block taken apart (``x + mixer(norm(x + P s))``, then its FFN); the counts
against the tensors; the caches against the uncached forward; bad specs against their one line.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

import specformer
from fixtures.caching import cached_logits
from fixtures.tiny import tiny_spec
from specformer.errors import SpecError
from specformer.model.summary import summarize
from specformer.spec.check import check_spec

# The shared block: attention 2 heads of 16 over d_model 32 (one kv head: qkv rows 32 + 16 + 16), SwiGLU 24,
# and no residual inside (residual_scales 0: its output is ffn(norm(attention(norm(x))))).
SHARED = {"layout": {"kind": "prenorm", "residual_scales": [0.0, 0.0]},
          "mixer": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1}, "norm": "rmsnorm",
          "ffn": {"kind": "swiglu", "hidden": 24},
          "output": "mixer_input", "projection": True,
          "adapters": {"rank": 3, "targets": {"mixer.qkv": {"inputs": 32, "outputs": [32, 16, 16]},
                                         "ffn.gate_up": {"inputs": 32, "outputs": [48]}}}}
USES = (1, 3)


def zamba_spec(**shared: Any) -> dict[str, Any]:
    """Four layers, the shared block before layers 1 and 3; layer 2 a Mamba-2 layer (a state under the uses)."""
    return tiny_spec(n_layers=4, shared_blocks={"attn": {**SHARED, **shared}},
                     layers=[{"select": list(USES), "shared": "attn"},
                             {"select": 2, "mixer": {"kind": "mamba2", "n_heads": 4, "head_dim": 16, "state_size": 8,
                                                     "n_groups": 1, "chunk": 4}}])


def _merged(model: Any, layer: int) -> torch.nn.Module:
    """A copy of the shared block with layer ``layer``'s adapters merged into its weights: each piece of rows
    of a map gets ``+ B_p A_p`` (the adapter pairs are ``use.adapters.<path>.<p>.down/up``)."""
    block = copy.deepcopy(model.shared_blocks["attn"])
    block._forward_hooks.clear()
    for m in block.modules():
        m._forward_hooks.clear()  # the copy runs without the model's adapter hooks
    use = model.shared_use_parts[str(layer)]
    for path, target in model.spec.model.shared_blocks["attn"].adapters.targets.items():
        pairs = use.adapters[path.split(".")[0]][path.split(".")[1]]
        delta = torch.cat([p.up.weight @ p.down.weight for p in pairs], dim=0)  # (rows, inputs)
        assert [p.up.weight.shape[0] for p in pairs] == target.outputs
        block.get_submodule(path).weight += delta
    return block


# Zamba2's: the shared block reads rmsnorm(concat(x, embeddings)) (64 wide) with attention of 2 heads of 32
# channels over that width (scaled by (32 / 2) ** -0.5, as Zamba's), its output back at d_model 32.
CONCAT = {"input": "concat_embeddings",
          "layout": {"kind": "prenorm", "mixer_pre_norm": False, "residual_scales": [0.0, 0.0]},
          "mixer": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1, "head_dim": 32, "input_width": 64,
                    "scale": 16 ** -0.5},
          "adapters": {"rank": 3, "targets": {"mixer.qkv": {"inputs": 64, "outputs": [64, 32, 32]},
                                              "ffn.gate_up": {"inputs": 32, "outputs": [48]}}}}


def _rmsnorm(x: torch.Tensor, norm: Any) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm.eps) * norm.weight


def _written_out(model: Any, ids: torch.Tensor, *, concat: bool = False) -> torch.Tensor:
    """embedding -> blocks, where a use's ``s = P_i S_i(x)`` (S_i: the shared block with use i's adapters) goes
    into block i as ``x + mixer(norm(x + s))`` then ``+ ffn(norm(.))``; final norm, tied head. With ``concat``
    S_i reads ``rmsnorm(concat(x, e))`` (e: the embeddings) and its mixer that unnormed."""
    from specformer.model.context import ForwardContext, default_positions

    positions = default_positions(*ids.shape, device="cpu")
    ctx = ForwardContext(positions=positions, positional=model.positional,
                         positional_state=model.positional.prepare(positions), plain_causal=True)
    x = e = model.embedding(ids)
    for index, block in enumerate(model.blocks):
        if index not in USES:
            x = block(x, ctx)
            continue
        shared = _merged(model, index)
        if concat:
            inner = shared.mixer(_rmsnorm(torch.cat([x, e], dim=-1), shared.input_norm), ctx)  # (B, T, 64) -> 32
        else:
            inner = shared.mixer(shared.attention_norm(x), ctx)
        s = shared.feed_forward(shared.ffn_norm(inner), ctx)  # no residual anywhere in the shared block
        s = s @ model.shared_use_parts[str(index)].projection.weight.T
        x = x + block.mixer(block.attention_norm(x + s), ctx)  # the residual is x, not x + s
        x = x + block.feed_forward(block.ffn_norm(x), ctx)
    return torch.nn.functional.linear(model.final_norm(x), model.embedding.weight)[..., : model.vocab_size]


def _randomise(model: Any) -> Any:
    """Adapters' B start at PyTorch's init like every linear (none are zero); scale them up so they matter."""
    with torch.no_grad():
        for p in model.shared_use_parts.parameters():
            p.mul_(3.0)
    return model


@torch.no_grad()
def test_each_use_adds_its_projected_shared_output_to_the_mixer_input_with_its_own_adapters() -> None:
    model = _randomise(specformer.build(zamba_spec(), seed=0)).double().eval()
    ids = torch.randint(0, model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(model(ids), _written_out(model, ids), rtol=1e-10, atol=1e-10)
    before = model(ids)
    model.shared_use_parts["3"].adapters["mixer"]["qkv"][1].up.weight.zero_()  # use 3's key adapter only
    after = model(ids)
    assert not torch.allclose(before, after)


@torch.no_grad()
def test_a_shared_block_can_read_the_stream_and_the_embeddings_concatenated() -> None:
    model = _randomise(specformer.build(zamba_spec(**CONCAT), seed=0)).double().eval()
    assert model.shared_blocks["attn"].input_norm.weight.shape == (64,)
    with torch.no_grad():
        model.shared_blocks["attn"].input_norm.weight.uniform_(0.5, 1.5)
    ids = torch.randint(0, model.vocab_size, (2, 9), generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(model(ids), _written_out(model, ids, concat=True), rtol=1e-10, atol=1e-10)
    logits, _ = cached_logits(model, ids, prompt=4)
    torch.testing.assert_close(logits, model(ids), rtol=1e-9, atol=1e-9)
    checked = check_spec(zamba_spec(**CONCAT))
    assert checked.sizes.parameters == checked.shape.parameters == model.num_parameters() == summarize(model).total


def test_per_use_tensors_have_their_own_names_and_are_counted_once_per_use() -> None:
    spec = zamba_spec()
    model = specformer.build(spec, seed=0)
    names = {n: tuple(p.shape) for n, p in model.state_dict().items() if n.startswith("shared_use_parts.")}
    per_use = {"projection.weight": (32, 32),
               "adapters.mixer.qkv.0.down.weight": (3, 32), "adapters.mixer.qkv.0.up.weight": (32, 3),
               "adapters.mixer.qkv.1.down.weight": (3, 32), "adapters.mixer.qkv.1.up.weight": (16, 3),
               "adapters.mixer.qkv.2.down.weight": (3, 32), "adapters.mixer.qkv.2.up.weight": (16, 3),
               "adapters.ffn.gate_up.0.down.weight": (3, 32), "adapters.ffn.gate_up.0.up.weight": (48, 3)}
    assert names == {f"shared_use_parts.{i}.{n}": s for i in USES for n, s in per_use.items()}
    stored = sum(p.numel() for p in model.parameters())
    one_use = 32 * 32 + 3 * (3 * 32 + 64) + 3 * (32 + 48)  # projection; three qkv pairs; one gate_up pair
    plain = zamba_spec(output="stream", projection=False, adapters=None)
    assert stored == specformer.build(plain, seed=0).num_parameters() + 2 * one_use
    assert summarize(model).total == summarize(spec).total == stored
    checked = check_spec(spec)
    assert checked.sizes.parameters == stored  # the torch-free size check
    assert checked.shape.parameters == stored  # the meta-device estimate


def test_every_use_trains_its_own_adapters_and_the_one_shared_tensor() -> None:
    model = specformer.build(zamba_spec(), seed=0).double()
    ids = torch.randint(0, model.vocab_size, (2, 6), generator=torch.Generator().manual_seed(2))
    model(ids).square().mean().backward()
    for i in USES:
        for p in model.shared_use_parts[str(i)].parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0
    assert model.shared_blocks["attn"].mixer.qkv.weight.grad.abs().sum() > 0


@torch.no_grad()
def test_cached_decoding_equals_the_uncached_forward() -> None:
    model = _randomise(specformer.build(zamba_spec(), seed=0)).double().eval()
    ids = torch.randint(0, model.vocab_size, (2, 10), generator=torch.Generator().manual_seed(3))
    logits, _ = cached_logits(model, ids, prompt=4)
    torch.testing.assert_close(logits, model(ids), rtol=1e-9, atol=1e-9)


def test_bad_per_use_options_are_one_clear_error() -> None:
    with pytest.raises(SpecError, match="projection needs output: mixer_input"):
        specformer.build(zamba_spec(output="stream"))
    wrong = {"rank": 2, "targets": {"mixer.qkv": {"inputs": 32, "outputs": [32, 16]}}}
    with pytest.raises(SpecError, match=r"adapters.targets.mixer.qkv gives inputs 32 and outputs \[32, 16\] \(sum 48\), "
                                        r"but the map is 32 -> 64") as err:
        specformer.build(zamba_spec(adapters=wrong))
    wrong = {"rank": 2, "targets": {"mixer.q": {"inputs": 32, "outputs": [32]}}}
    with pytest.raises(SpecError, match=r"'mixer.q', which is not a linear map of the block; its linear maps are "
                                        r"\['ffn.down', 'ffn.gate_up', 'mixer.out', 'mixer.qkv'\]"):
        specformer.build(zamba_spec(adapters=wrong))
    with pytest.raises(SpecError, match="input concat_embeddings needs output: mixer_input"):
        specformer.build(zamba_spec(**CONCAT, output="stream", projection=False))
    with pytest.raises(SpecError, match="use layout {kind: prenorm, mixer_pre_norm: false") as err:
        specformer.build(zamba_spec(**{**CONCAT, "layout": SHARED["layout"]}))
    assert [p.path for p in err.value.problems] == ["model.shared_blocks.attn.layout"]
    postnorm = zamba_spec()
    postnorm["model"]["block"]["layout"] = "postnorm"
    with pytest.raises(SpecError, match="takes no mixer input addend; use layout prenorm"):
        specformer.build(postnorm)


def test_activation_checkpointing_recomputes_a_layer_with_the_addend_it_ran_with() -> None:
    from specformer_train.recompute import enable_activation_checkpointing

    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(6))

    def grads(recompute: bool) -> dict[str, torch.Tensor]:
        model = _randomise(specformer.build(zamba_spec(**CONCAT), seed=0)).double().train()
        if recompute:
            enable_activation_checkpointing(model)
        model(ids).square().mean().backward()
        return {n: p.grad for n, p in model.named_parameters()}

    plain, recomputed = grads(False), grads(True)
    for name, grad in plain.items():
        torch.testing.assert_close(recomputed[name], grad, rtol=1e-9, atol=1e-12, msg=name)
