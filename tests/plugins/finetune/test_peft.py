"""PEFT interop both ways, against the peft library on a tiny Llama built locally (no hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specformer
from specformer.cli import main

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

TOLERANCE = 1e-4


@pytest.fixture
def llama_dir(tmp_path: Path) -> Path:
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "llama")
    return tmp_path / "llama"


@pytest.fixture
def base(tmp_path: Path, llama_dir: Path) -> Path:
    out = tmp_path / "base.safetensors"
    assert main(["hf", "import", str(llama_dir), str(out)]) == 0
    return out


def _ids() -> torch.Tensor:
    return torch.randint(0, 96, (2, 20), generator=torch.Generator().manual_seed(1))


def _randomise_lora(module: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)


def test_a_peft_adapter_imports_onto_the_imported_base(tmp_path: Path, llama_dir: Path, base: Path) -> None:
    hf = transformers.AutoModelForCausalLM.from_pretrained(llama_dir)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], lora_dropout=0.0)
    tuned = peft.get_peft_model(hf, config)
    _randomise_lora(tuned, seed=2)
    tuned.save_pretrained(tmp_path / "peft")
    out = tmp_path / "adapter.safetensors"
    assert main(["hf", "import", str(tmp_path / "peft"), str(out), "--base", str(base)]) == 0
    ours = specformer.load(out).eval()
    assert ours.adapter.targets == ["blocks.0.attention.qkv", "blocks.0.ffn.down", "blocks.1.attention.qkv",
                                    "blocks.1.ffn.down"]
    tuned.eval()
    with torch.no_grad():
        expected = tuned(_ids()).logits
        plain = specformer.load(base).eval()(_ids())
    got = ours(_ids())
    assert (got - expected).abs().max().item() <= TOLERANCE
    assert (plain - expected).abs().max().item() > 100 * TOLERANCE  # the adapter changed the logits


def test_an_adapter_exports_for_peft_on_the_exported_base(tmp_path: Path, base: Path) -> None:
    from specformer_finetune.adapter_file import base_reference, save_adapter
    from specformer_finetune.apply import apply_adapter

    model = specformer.load(base)
    info = apply_adapter(model, {"kind": "lora", "rank": 3, "alpha": 6, "targets": ["blocks.*.attention.*",
                                                                                  "blocks.*.ffn.gate_up"]})
    _randomise_lora(model, seed=3)
    info.base = base_reference(base)
    save_adapter(model, tmp_path / "adapter.safetensors")

    assert main(["hf", "export", str(base), str(tmp_path / "hf_base")]) == 0
    assert main(["hf", "export", str(tmp_path / "adapter.safetensors"), str(tmp_path / "hf_adapter"), "--peft"]) == 0
    config = json.loads((tmp_path / "hf_adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 3
    assert "model.layers.0.self_attn.q_proj" in config["target_modules"]

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf_base")
    loaded = peft.PeftModel.from_pretrained(hf, tmp_path / "hf_adapter").eval()
    ours = specformer.load(tmp_path / "adapter.safetensors").eval()
    with torch.no_grad():
        theirs = loaded(_ids()).logits
    assert (ours(_ids()) - theirs).abs().max().item() <= TOLERANCE


def test_export_of_an_adapter_checkpoint_without_peft_is_the_merged_model(tmp_path: Path, base: Path) -> None:
    from specformer_finetune.adapter_file import base_reference, save_adapter
    from specformer_finetune.apply import apply_adapter

    model = specformer.load(base)
    apply_adapter(model, {"kind": "lora", "rank": 2, "targets": ["blocks.*.ffn.down"]}).base = base_reference(base)
    _randomise_lora(model, seed=4)
    save_adapter(model, tmp_path / "adapter.safetensors")
    assert main(["hf", "export", str(tmp_path / "adapter.safetensors"), str(tmp_path / "merged")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        theirs = hf(_ids()).logits
    assert (model.eval()(_ids()) - theirs).abs().max().item() <= TOLERANCE


def test_peft_flag_on_a_plain_checkpoint_is_refused(tmp_path: Path, base: Path) -> None:
    assert main(["hf", "export", str(base), str(tmp_path / "x"), "--peft"]) == 2
