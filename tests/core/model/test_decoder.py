"""The Decoder skeleton: causality, positions and padding, the KV-cache contract, model-level options."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import specformer

ATTENTION_VARIANTS = {
    "mha": {"kind": "attention", "n_heads": 4},
    "gqa": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2},
    "mqa": {"kind": "attention", "n_heads": 4, "n_kv_heads": 1, "head_dim": 12},
    "window": {"kind": "attention", "n_heads": 4, "window": 3},
    "qk_norm": {"kind": "attention", "n_heads": 4, "qk_norm": "rmsnorm"},
    "softcap": {"kind": "attention", "n_heads": 4, "logit_softcap": 5.0},
    "eager": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "backend": "eager"},
}


def positional_schemes() -> list[str]:
    return specformer.get_registry().names("positional")


def spec_with(fresh_tiny_spec: dict, positional: str, attention: dict, layout: str = "prenorm") -> dict:
    spec = copy.deepcopy(fresh_tiny_spec)
    spec["model"]["positional"] = positional
    spec["model"]["block"]["mixer"] = attention
    spec["model"]["block"]["layout"] = layout
    return spec


@pytest.mark.parametrize("attention", list(ATTENTION_VARIANTS))
@pytest.mark.parametrize("positional", positional_schemes())
def test_changing_later_tokens_never_changes_earlier_logits(fresh_tiny_spec, positional, attention):
    model = specformer.build(spec_with(fresh_tiny_spec, positional, ATTENTION_VARIANTS[attention]), seed=0).eval()
    x = torch.randint(0, 97, (2, 12))
    y = x.clone()
    y[:, 7:] = torch.randint(0, 97, (2, 5))
    a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :7], b[:, :7], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 7:], b[:, 7:])


class ConcatCache:
    """The simplest KVCache: append keys/values; used to check the Decoder honours the protocol."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def update(self, layer_index, key, value, positions):
        if layer_index in self.layers:
            k, v, p = self.layers[layer_index]
            key, value, positions = torch.cat([k, key], 2), torch.cat([v, value], 2), torch.cat([p, positions], 1)
        self.layers[layer_index] = (key, value, positions)
        return key, value, positions


@pytest.mark.parametrize("attention", list(ATTENTION_VARIANTS))
@pytest.mark.parametrize("positional", positional_schemes())
def test_incremental_forward_through_a_cache_equals_full_forward(fresh_tiny_spec, positional, attention):
    model = specformer.build(spec_with(fresh_tiny_spec, positional, ATTENTION_VARIANTS[attention]), seed=0).eval()
    x = torch.randint(0, 97, (2, 10))
    full = model(x)
    cache = ConcatCache()
    steps = [model(x[:, :6], positions=torch.arange(6).expand(2, 6), cache=cache)]
    for t in range(6, 10):
        steps.append(model(x[:, t : t + 1], positions=torch.full((2, 1), t), cache=cache))
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positional", positional_schemes())
def test_left_padding_with_negative_positions_gives_the_unpadded_logits(fresh_tiny_spec, positional):
    model = specformer.build(spec_with(fresh_tiny_spec, positional, ATTENTION_VARIANTS["gqa"]), seed=0).eval()
    x = torch.randint(0, 97, (1, 6))
    alone = model(x)
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), x], 1)
    positions = torch.tensor([[-1, -1, -1, 0, 1, 2, 3, 4, 5]])
    out = model(padded, positions=positions)
    torch.testing.assert_close(out[:, 3:], alone, rtol=1e-5, atol=1e-5)


def test_forward_with_cache_requires_positions(fresh_tiny_spec):
    model = specformer.build(fresh_tiny_spec)
    with pytest.raises(ValueError, match="needs the absolute positions"):
        model(torch.zeros(1, 3, dtype=torch.long), cache=ConcatCache())


def test_last_only_returns_the_last_position(fresh_tiny_spec):
    model = specformer.build(fresh_tiny_spec, seed=0)
    x = torch.randint(0, 97, (2, 9))
    last = model(x, last_only=True)
    assert last.shape == (2, 1, 97)
    # The head runs on one row instead of nine, so BLAS may pick another kernel: equal to rounding.
    torch.testing.assert_close(last, model(x)[:, -1:], rtol=1e-5, atol=1e-6)


def test_tied_head_is_the_embedding_and_untied_has_its_own(fresh_tiny_spec):
    tied = specformer.build(fresh_tiny_spec, seed=0)
    assert tied.lm_head is None
    assert "lm_head.weight" not in tied.state_dict()
    fresh_tiny_spec["model"].update(tie_embeddings=False, lm_head_bias=True)
    untied = specformer.build(fresh_tiny_spec, seed=0)
    assert untied.lm_head.weight.data_ptr() != untied.embedding.weight.data_ptr()
    assert untied.lm_head.bias is not None


def test_model_level_options_by_formula(fresh_tiny_spec):
    """Embedding multiplier, final soft-cap and vocab padding, checked against the formulas."""
    base = specformer.build(fresh_tiny_spec, seed=0).eval()
    fresh_tiny_spec["model"].update(embedding_multiplier="sqrt_d_model", logit_softcap=2.0, pad_vocab_to_multiple=64)
    model = specformer.build(fresh_tiny_spec, seed=0).eval()
    assert model.embedding.weight.shape == (128, 32)
    with torch.no_grad():
        model.embedding.weight[:97] = base.embedding.weight
        model.load_state_dict({**model.state_dict(), **{k: v for k, v in base.state_dict().items() if k != "embedding.weight"}})
    x = torch.randint(0, 97, (2, 5))

    # The same computation written out: scale the embeddings, run the blocks, cap the logits.
    h = base.embedding(x) * math.sqrt(32)
    ctx_positions = torch.arange(5).expand(2, 5)
    from specformer.model.context import ForwardContext

    ctx = ForwardContext(positions=ctx_positions, positional=base.positional,
                         positional_state=base.positional.prepare(ctx_positions), plain_causal=True)
    for block in base.blocks:
        h = block(h, ctx)
    raw = torch.nn.functional.linear(base.final_norm(h), model.embedding.weight)
    expected = (2.0 * torch.tanh(raw / 2.0))[..., :97]
    out = model(x)
    assert out.shape == (2, 5, 97)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_auxiliary_loss_collects_module_losses(fresh_tiny_spec):
    model = specformer.build(fresh_tiny_spec)
    assert model.auxiliary_loss() is None
    model.blocks[0].ffn.aux_loss = torch.tensor(0.5)
    model.blocks[1].ffn.aux_loss = torch.tensor(0.25)
    assert model.auxiliary_loss().item() == 0.75


def test_input_must_be_two_dimensional(fresh_tiny_spec):
    model = specformer.build(fresh_tiny_spec)
    with pytest.raises(ValueError, match="must be \\(batch, time\\)"):
        model(torch.zeros(5, dtype=torch.long))
