"""LoRA: the forward formula, the exact first forward, targets, merging, and adapter checkpoints."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import specformer
from specformer.errors import CheckpointError, SpecError
from specformer_finetune.adapter_file import base_reference, save_adapter
from specformer_finetune.apply import adapter_state, apply_adapter, count_parameters, merge_adapter
from specformer_finetune.lora import LoRALinear
from specformer_finetune.params import LoRAParams
from specformer_finetune.targets import matches

from .conftest import TINY_MODEL

LORA = {"kind": "lora", "rank": 4, "alpha": 8, "targets": ["blocks.*.mixer.qkv", "blocks.*.ffn.*"]}


def _model(seed: int = 0) -> torch.nn.Module:
    return specformer.build({"model": copy.deepcopy(TINY_MODEL)}, seed=seed).eval()


def _randomise_adapter(model: torch.nn.Module, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def test_forward_is_base_plus_scaled_low_rank_update() -> None:
    torch.manual_seed(0)
    base = torch.nn.Linear(12, 7)
    layer = LoRALinear(LoRAParams(rank=3, alpha=6.0), base=copy.deepcopy(base))
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(2, 5, 12)
    expected = x @ base.weight.T + base.bias + (x @ layer.lora_A.T @ layer.lora_B.T) * (6.0 / 3)
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layer.delta_weight(), layer.lora_B @ layer.lora_A * 2.0)


def test_gradients_equal_the_written_out_formula() -> None:
    """The fused forward (one addmm, B.T laid out row-major) gives x, A and B the formula's gradients."""
    torch.manual_seed(0)
    layer = LoRALinear(LoRAParams(rank=3, alpha=6.0), base=torch.nn.Linear(12, 7))
    with torch.no_grad():
        layer.lora_B.normal_()
    A, B = (p.detach().clone().requires_grad_() for p in (layer.lora_A, layer.lora_B))
    x = torch.randn(2, 5, 12, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    weights = torch.randn(2, 5, 7)
    (layer(x) * weights).sum().backward()
    expected = x_ref @ layer.base.weight.T + layer.base.bias + (x_ref @ A.T @ B.T) * 2.0
    (expected * weights).sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layer.lora_A.grad, A.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layer.lora_B.grad, B.grad, rtol=1e-5, atol=1e-6)
    assert layer.base.weight.grad is None  # frozen: autograd forms no weight gradient for the base


def test_dropout_applies_to_the_adapter_input_only() -> None:
    torch.manual_seed(0)
    layer = LoRALinear(LoRAParams(rank=3, alpha=6.0, dropout=0.5), base=torch.nn.Linear(12, 7))
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(4, 12)
    torch.manual_seed(5)
    dropped = torch.nn.functional.dropout(x, 0.5, training=True)
    torch.manual_seed(5)
    trained = layer(x)
    torch.testing.assert_close(trained, layer.base(x) + dropped @ layer.lora_A.T @ layer.lora_B.T * 2.0,
                               rtol=1e-5, atol=1e-6)
    layer.eval()
    torch.testing.assert_close(layer(x), layer.base(x) + x @ layer.lora_A.T @ layer.lora_B.T * 2.0,
                               rtol=1e-5, atol=1e-6)
    assert LoRALinear(LoRAParams(rank=3, alpha=6.0), base=torch.nn.Linear(12, 7)).dropout is None  # dropout 0: no op


def test_zero_b_first_forward_equals_base_exactly() -> None:
    model = _model()
    x = torch.randint(0, 259, (2, 20))
    before = model(x)
    apply_adapter(model, LORA)
    assert torch.equal(model(x), before)


def test_only_adapter_parameters_train() -> None:
    model = _model()
    apply_adapter(model, LORA)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.rsplit(".", 1)[-1] in ("lora_A", "lora_B") for n in trainable)
    assert len(trainable) == 2 * 2 * 3  # 2 layers x (qkv, gate_up, down) x (A, B)
    n_trainable, total = count_parameters(model)
    assert n_trainable == sum(p.numel() for n, p in model.named_parameters() if n in trainable)
    assert total == sum(p.numel() for p in model.parameters())


def test_targets_match_by_segment_with_globs() -> None:
    assert matches("blocks.*.mixer.qkv", "blocks.3.mixer.qkv")
    assert not matches("blocks.*.qkv", "blocks.3.mixer.qkv")  # * stays within a segment
    assert matches("**.down", "blocks.1.ffn.down")
    assert matches("blocks.1?.ffn.*", "blocks.12.ffn.gate_up") and not matches("blocks.1?.ffn.*", "blocks.1.ffn.down")


def test_target_matching_nothing_names_the_model_layers() -> None:
    with pytest.raises(ValueError, match=r"matches no linear layer.*blocks\.\*\.mixer\.qkv"):
        apply_adapter(_model(), {"kind": "lora", "targets": ["blocks.*.attn.q_proj"]})


def test_bad_params_are_spec_errors() -> None:
    with pytest.raises(SpecError, match="rank"):
        apply_adapter(_model(), {"kind": "lora", "rank": 0})
    with pytest.raises(SpecError, match="adapter"):
        apply_adapter(_model(), {"kind": "dora2"})


def test_merge_equals_adapter_logits() -> None:
    model = _model()
    apply_adapter(model, LORA)
    _randomise_adapter(model)
    x = torch.randint(0, 259, (2, 20))
    adapted = model(x)
    merge_adapter(model)
    assert not any("lora" in n for n, _ in model.named_parameters())
    torch.testing.assert_close(model(x), adapted, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scheme", ["bf16", "int8"])
def test_quantized_base_passes_gradients_to_every_adapter(scheme: str) -> None:
    model = _model()
    apply_adapter(model, {**LORA, "targets": ["blocks.*.mixer.qkv"], "base": scheme})
    _randomise_adapter(model)
    loss = model(torch.randint(0, 259, (2, 12))).logsumexp(-1).mean()
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    assert len(grads) == 4 and all(g is not None and g.abs().sum() > 0 for g in grads.values())


def test_adapter_checkpoint_holds_only_the_adapter_and_loads_onto_its_base(tmp_path: Path, base_ckpt: Path) -> None:
    model = specformer.load(base_ckpt).eval()
    info = apply_adapter(model, LORA)
    _randomise_adapter(model)
    info.base = base_reference(base_ckpt)
    save_adapter(model, tmp_path / "adapter.safetensors")
    from safetensors import safe_open

    with safe_open(str(tmp_path / "adapter.safetensors"), "pt") as f:
        assert set(f.keys()) == set(adapter_state(model))
    loaded = specformer.load(tmp_path / "adapter.safetensors").eval()
    x = torch.randint(0, 259, (1, 16))
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_adapter_checkpoint_refuses_a_changed_or_missing_base(tmp_path: Path, base_ckpt: Path) -> None:
    model = specformer.load(base_ckpt)
    info = apply_adapter(model, LORA)
    info.base = base_reference(base_ckpt)
    save_adapter(model, tmp_path / "adapter.safetensors")
    other = _model(seed=9)
    specformer.save(other, base_ckpt)  # same shapes, other weights
    with pytest.raises(CheckpointError, match="has changed since the adapter was trained"):
        specformer.load(tmp_path / "adapter.safetensors")
    base_ckpt.unlink()
    with pytest.raises(CheckpointError, match="base checkpoint .* is not there"):
        specformer.load(tmp_path / "adapter.safetensors")


def test_generate_eval_and_summary_take_an_adapter_checkpoint(tmp_path: Path, base_ckpt: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from specformer.cli.main import main

    model = specformer.load(base_ckpt)
    apply_adapter(model, LORA).base = base_reference(base_ckpt)
    _randomise_adapter(model)
    save_adapter(model, tmp_path / "adapter.safetensors")
    (tmp_path / "notes.txt").write_text("the model reads tokens and predicts the next one\n" * 40)
    adapter = str(tmp_path / "adapter.safetensors")
    assert main(["generate", adapter, "--prompt", "the", "--max-new-tokens", "4", "--seed", "0"]) == 0
    assert main(["eval", adapter, "--data", str(tmp_path / "notes.txt")]) == 0
    adapted = capsys.readouterr().out
    assert main(["eval", str(base_ckpt), "--data", str(tmp_path / "notes.txt")]) == 0
    plain = capsys.readouterr().out
    # eval scored the adapted model, not the bare base: the losses differ.
    assert float(adapted.split("loss")[1].split()[0]) != float(plain.split("loss")[1].split()[0])
    assert main(["summary", adapter]) == 0
