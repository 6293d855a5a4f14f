"""Adapters and targets written when the block's token mixer was called `attention` keep working as `mixer`.

``tests/fixtures/pre_mixer/adapter.safetensors`` was saved by specformer before the rename:
its tensors are ``blocks.0.attention.qkv.lora_A`` / ``lora_B``, its header's targets
``blocks.*.attention.qkv`` and ``blocks.0.attention.qkv``; its base is ``model.safetensors``
beside it, and ``adapter_expected.safetensors`` the logits the adapted model gave.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import specformer
from specformer.checkpoint.file import read_metadata
from specformer.renamed import RenamedWarning
from specformer_finetune import apply_adapter, merge_adapter
from specformer_finetune.adapter_file import save_adapter
from fixtures.tiny import tiny_spec

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pre_mixer"


def test_an_adapter_saved_before_the_rename_loads_and_gives_its_logits(tmp_path: Path) -> None:
    for name in ("model.safetensors", "adapter.safetensors"):  # the pair moved together still loads
        shutil.copy(FIXTURES / name, tmp_path / name)
    ids = load_file(str(FIXTURES / "expected.safetensors"))["ids"]
    expected = load_file(str(FIXTURES / "adapter_expected.safetensors"))["logits"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = specformer.load(tmp_path / "adapter.safetensors").eval()
    lines = {str(w.message) for w in caught if issubclass(w.category, RenamedWarning)}
    assert any("adapter targets: 'blocks.*.attention.qkv' is read as 'blocks.*.mixer.qkv'" in line for line in lines)
    assert model.adapter.targets == ["blocks.0.mixer.qkv"] and model.adapter.ref["targets"] == ["blocks.*.mixer.qkv"]
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=1e-5, atol=1e-6)  # saved on another CPU's kernels: close, not equal
    # Saved again, it is an adapter of now: no old name left, the same logits.
    save_adapter(model, tmp_path / "again.safetensors")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedWarning)  # the base beside it is still the old file
        again = specformer.load(tmp_path / "again.safetensors").eval()
    assert ".attention." not in read_metadata(tmp_path / "again.safetensors")["adapter"]
    with torch.no_grad():
        torch.testing.assert_close(again(ids), expected, rtol=1e-5, atol=1e-6)  # saved on another CPU's kernels: close, not equal
        assert torch.allclose(merge_adapter(again)(ids), expected, atol=1e-5)


def test_targets_written_the_old_way_select_the_mixer_with_one_line() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RenamedWarning)
        model = specformer.load(FIXTURES / "model.safetensors")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        info = apply_adapter(model, {"kind": "lora", "rank": 2,
                                     "targets": ["blocks.*.attention.qkv", "blocks.*.attention.out", "blocks.*.ffn.*"]})
    lines = [str(w.message) for w in caught if issubclass(w.category, RenamedWarning)]
    assert len(lines) == 1 and "'blocks.*.attention.qkv' is read as 'blocks.*.mixer.qkv'" in lines[0], lines
    assert info.targets == ["blocks.0.mixer.qkv", "blocks.0.mixer.out", "blocks.0.ffn.gate_up", "blocks.0.ffn.down",
                            "blocks.1.mixer.out", "blocks.1.ffn.gate_up", "blocks.1.ffn.down"]
    assert info.ref["targets"] == ["blocks.*.mixer.qkv", "blocks.*.mixer.out", "blocks.*.ffn.*"]


def test_an_old_target_that_names_nothing_still_says_what_the_model_has() -> None:
    model = specformer.build(tiny_spec(vocab_size=32, d_model=16, n_layers=1, context_length=8,
                                       block={"mixer": "none", "ffn": {"kind": "swiglu", "hidden": 24}}))
    with pytest.warns(RenamedWarning), pytest.raises(ValueError, match=r"target 'blocks.\*.mixer.qkv' matches no "
                                                                         r"linear layer.*blocks.\*.ffn.down"):
        apply_adapter(model, {"kind": "lora", "targets": ["blocks.*.attention.qkv"]})
