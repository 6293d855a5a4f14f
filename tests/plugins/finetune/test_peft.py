"""PEFT interop both ways, against the peft library on a tiny Llama built locally (no hub)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import specformer
from specformer.cli.main import main

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
    assert main(["peft", "import", str(tmp_path / "peft"), str(out), "--base", str(base)]) == 0
    ours = specformer.load(out).eval()
    assert ours.adapter.targets == ["blocks.0.mixer.qkv", "blocks.0.ffn.down", "blocks.1.mixer.qkv",
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
    info = apply_adapter(model, {"kind": "lora", "rank": 3, "alpha": 6, "targets": ["blocks.*.mixer.*",
                                                                                  "blocks.*.ffn.gate_up"]})
    _randomise_lora(model, seed=3)
    info.base = base_reference(base)
    save_adapter(model, tmp_path / "adapter.safetensors")

    assert main(["hf", "export", str(base), str(tmp_path / "hf_base")]) == 0
    assert main(["peft", "export", str(tmp_path / "adapter.safetensors"), str(tmp_path / "hf_adapter")]) == 0
    config = json.loads((tmp_path / "hf_adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 3
    assert "model.layers.0.self_attn.q_proj" in config["target_modules"]

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf_base")
    loaded = peft.PeftModel.from_pretrained(hf, tmp_path / "hf_adapter").eval()
    ours = specformer.load(tmp_path / "adapter.safetensors").eval()
    with torch.no_grad():
        theirs = loaded(_ids()).logits
    assert (ours(_ids()) - theirs).abs().max().item() <= TOLERANCE


def test_an_adapter_checkpoint_merged_then_exported_is_the_adapted_model(tmp_path: Path, base: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from specformer_finetune.adapter_file import base_reference, save_adapter
    from specformer_finetune.apply import apply_adapter

    model = specformer.load(base)
    apply_adapter(model, {"kind": "lora", "rank": 2, "targets": ["blocks.*.ffn.down"]}).base = base_reference(base)
    _randomise_lora(model, seed=4)
    save_adapter(model, tmp_path / "adapter.safetensors")
    adapter = tmp_path / "adapter.safetensors"
    assert main(["hf", "export", str(adapter), str(tmp_path / "merged")]) == 2  # hf knows no adapters: it says where to go
    err = capsys.readouterr().err
    assert f"specformer peft export {adapter}" in err and f"specformer merge {adapter} -o MERGED.safetensors" in err
    assert main(["merge", str(adapter), "-o", str(tmp_path / "merged.safetensors")]) == 0
    assert main(["hf", "export", str(tmp_path / "merged.safetensors"), str(tmp_path / "merged")]) == 0
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        theirs = hf(_ids()).logits
    assert (model.eval()(_ids()) - theirs).abs().max().item() <= TOLERANCE


def test_peft_export_of_a_plain_checkpoint_is_refused(tmp_path: Path, base: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["peft", "export", str(base), str(tmp_path / "x")]) == 2
    assert "is a plain checkpoint" in capsys.readouterr().err


def test_hf_import_of_a_peft_folder_names_the_peft_command(tmp_path: Path, peft_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["hf", "import", str(peft_dir), str(tmp_path / "a.safetensors")]) == 2
    assert f"specformer peft import {peft_dir}" in capsys.readouterr().err


@pytest.fixture
def peft_dir(tmp_path: Path, llama_dir: Path) -> Path:
    """A rank-4 PEFT LoRA folder on q_proj and v_proj of the tiny Llama."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(llama_dir)
    tuned = peft.get_peft_model(hf, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                    lora_dropout=0.0))
    _randomise_lora(tuned, seed=3)
    tuned.save_pretrained(tmp_path / "peft")
    return tmp_path / "peft"


def _edit_config(folder: Path, **changes) -> None:
    path = folder / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _edit_tensors(folder: Path, change) -> None:
    from safetensors.torch import load_file, save_file

    path = folder / "adapter_model.safetensors"
    tensors = load_file(path)
    change(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, path)


Q_A = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
Q_B = "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"

#: (config changes, tensor change, the file the message names, words it must hold)
HOSTILE = [
    ({"r": 1e12}, None, "adapter_model.safetensors", "says r = 1000000000000"),
    ({"r": 8}, None, "adapter_model.safetensors", "have rank 4, but adapter_config.json says r = 8"),
    ({"rank_pattern": {"q_proj": 2}}, None, "adapter_model.safetensors", "rank_pattern['q_proj'] = 2"),
    ({"r": "4"}, None, "adapter_config.json", "r must be a whole number of at least 1 (the LoRA rank), got '4'"),
    ({"r": 0}, None, "adapter_config.json", "r must be a whole number"),
    ({"r": 4.5}, None, "adapter_config.json", "r must be a whole number"),
    ({"r": True}, None, "adapter_config.json", "r must be a whole number"),
    ({"lora_alpha": -8}, None, "adapter_config.json", "lora_alpha must be a number above 0"),
    ({"lora_alpha": "8"}, None, "adapter_config.json", "lora_alpha must be a number above 0"),
    ({"alpha_pattern": {"v_proj": -1}}, None, "adapter_config.json", "alpha_pattern['v_proj'] must be a number"),
    ({"rank_pattern": [4]}, None, "adapter_config.json", "rank_pattern must be an object"),
    ({}, lambda t: t.update({Q_A: t[Q_A][:, :-3]}), "adapter_model.safetensors",
     "q_proj's update is (32, 29) (lora_B out x lora_A in), but the base's"),
    ({}, lambda t: t.update({Q_A: t[Q_A][None]}), "adapter_model.safetensors", "must be a non-empty 2-d float matrix"),
    ({}, lambda t: t.update({Q_B: t[Q_B].to(torch.int32)}), "adapter_model.safetensors", "2-d float matrix"),
    ({}, lambda t: t.update({Q_B: t[Q_B][:, :3]}), "adapter_model.safetensors", "have rank 3"),
    ({}, lambda t: t.pop(Q_A), "adapter_model.safetensors", "has no matching lora_A"),
    ({}, lambda t: t[Q_B].fill_(float("nan")), "adapter_model.safetensors", "NaN or infinite"),
]


@pytest.mark.parametrize("changes, tensor_change, file, words", HOSTILE,
                         ids=[f"{i}-{next(iter(h[0]), 'tensors')}" for i, h in enumerate(HOSTILE)])
def test_a_config_or_tensors_that_do_not_make_an_adapter_are_one_line(tmp_path, capsys, peft_dir, base, changes,
                                                                      tensor_change, file, words) -> None:
    _edit_config(peft_dir, **changes)
    if tensor_change is not None:
        _edit_tensors(peft_dir, tensor_change)
    capsys.readouterr()  # the fixtures' own output
    code = main(["peft", "import", str(peft_dir), str(tmp_path / "a.safetensors"), "--base", str(base)])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert str(peft_dir / file) in lines[0] and words in lines[0], lines[0]
    assert not (tmp_path / "a.safetensors").exists()


def test_a_whole_number_written_as_a_float_is_a_rank(tmp_path, peft_dir, base) -> None:
    _edit_config(peft_dir, r=4.0, lora_alpha=8)
    assert main(["peft", "import", str(peft_dir), str(tmp_path / "a.safetensors"), "--base", str(base)]) == 0
