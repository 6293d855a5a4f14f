"""A quantized checkpoint saved when the block's token mixer was called `attention` loads as `mixer`.

``tests/fixtures/pre_mixer/int8.safetensors`` was quantized (int8) and saved by specformer
before the rename: its recipe lists ``blocks.0.attention.qkv``, its tensors are
``blocks.0.attention.qkv.qweight.q``; ``int8_expected.safetensors`` holds its logits.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file

import specformer
from specformer.renamed import RenamedWarning
from specformer_quant.apply import RECIPE_KEY, recipe_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "pre_mixer"


def test_a_quantized_checkpoint_saved_before_the_rename_loads_and_gives_its_logits(tmp_path: Path) -> None:
    ids = load_file(str(FIXTURES / "expected.safetensors"))["ids"]
    expected = load_file(str(FIXTURES / "int8_expected.safetensors"))["logits"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = specformer.load(FIXTURES / "int8.safetensors").eval()
    lines = [str(w.message) for w in caught if issubclass(w.category, RenamedWarning)]
    assert len(lines) == 1 and "int8.safetensors: model.block.attention" in lines[0], lines
    assert "blocks.0.mixer.qkv" in model.quantization["linears"]
    assert not any(".attention." in name for name in model.quantization["linears"])
    with torch.no_grad():
        assert torch.equal(model(ids), expected)
    specformer.save(model, tmp_path / "now.safetensors", metadata={RECIPE_KEY: recipe_json(model.quantization)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RenamedWarning)  # saved again: named as now throughout
        again = specformer.load(tmp_path / "now.safetensors").eval()
    with torch.no_grad():
        assert torch.equal(again(ids), expected)
