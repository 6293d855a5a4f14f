"""``specformer hf import|export|families`` end to end, exit codes included."""

from __future__ import annotations

import json

import torch

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.cli.main import main
from specformer_text import CONFIG_KEY, FAMILY_KEY
from fixtures.tiny import tiny_spec


def test_import_writes_checkpoint_and_readable_spec_then_export_round_trips(llama_dir, tmp_path, capsys):
    out = tmp_path / "llama.safetensors"
    assert main(["hf", "import", str(llama_dir.directory), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "Llama" in printed and str(out) in printed

    model = specformer.load(out)
    for name, tensor in llama_dir.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    metadata = read_metadata(out)
    assert metadata[FAMILY_KEY] == "llama"
    assert json.loads(metadata[CONFIG_KEY])["model_type"] == "llama"

    # The spec beside the checkpoint is what the checkpoint holds, in a form people edit.
    spec_file = tmp_path / "llama.yaml"
    text = spec_file.read_text()
    assert text.startswith("# Imported by `specformer hf import`")
    assert "kind: rope" in text
    assert specformer.load_spec(spec_file).to_dict() == model.spec.to_dict()

    exported = tmp_path / "hf"
    assert main(["hf", "export", str(out), str(exported)]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    from transformers import AutoModelForCausalLM

    reloaded = AutoModelForCausalLM.from_pretrained(exported).eval()
    ids = torch.randint(0, 128, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (reloaded(ids).logits - llama_dir.hf(ids).logits).abs().max().item() <= 1e-4


def test_import_with_dtype_and_spec_path(llama_dir, tmp_path):
    out, spec = tmp_path / "m.safetensors", tmp_path / "specs" / "m.yaml"
    spec.parent.mkdir()
    assert main(["hf", "import", str(llama_dir.directory), str(out), "--dtype", "bfloat16", "--spec-out", str(spec)]) == 0
    assert spec.is_file()
    assert {p.dtype for p in specformer.load(out).parameters()} == {torch.bfloat16}


def test_user_errors_exit_2_with_one_line(tmp_path, capsys):
    assert main(["hf", "import", str(tmp_path / "missing"), str(tmp_path / "o.safetensors")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "not a directory" in err and "Traceback" not in err
    assert main(["hf", "import", str(tmp_path), str(tmp_path / "o.bin")]) == 2
    assert "must be a .safetensors file" in capsys.readouterr().err
    assert main(["hf", "export", str(tmp_path / "nope.safetensors"), str(tmp_path / "d")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err


def test_export_refusal_exits_2(tmp_path, capsys):
    spec = tiny_spec(vocab_size=64, n_layers=1, context_length=16, positional={"kind": "sinusoidal"},
                     block={"layout": "postnorm", "norm": "layernorm", "mixer": {"kind": "attention", "n_heads": 2},
                            "ffn": "mlp"})
    checkpoint = specformer.save(specformer.build(spec, seed=0), tmp_path / "c.safetensors")
    assert main(["hf", "export", str(checkpoint), str(tmp_path / "d")]) == 2
    err = capsys.readouterr().err
    # One line: the part most families lack and the closest families, no family's whole reason.
    assert err.startswith("error: no Hugging Face family can express this spec: model.positional.kind 'sinusoidal' "
                          "has no counterpart in ") and err.count("\n") == 1, err
    assert ("; the closest: GPT-2 (gpt2) and Llama (llama) lack that, GPT-NeoX (gpt_neox) lacks "
            "model.block.layout.kind 'postnorm'; each family's reason: --verbose\n") in err
    assert "multimodal" not in err and "has no equivalent" not in err
    # --verbose: the same line, then each family's reason (a family exporting through another is none).
    assert main(["hf", "export", str(checkpoint), str(tmp_path / "d"), "--verbose"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == err.removesuffix(" --verbose\n")
    assert lines[1] == ("  GPT-2 (gpt2): model.positional.kind: 'sinusoidal' has no equivalent in Hugging Face GPT-2 "
                        "(which uses 'learned')")
    assert len(lines) > 20 and not any("multimodal" in line for line in lines)
    assert not (tmp_path / "d").exists()


def test_unread_config_fields_are_printed_as_warnings(llama_dir, tmp_path, capsys):
    import shutil

    d = tmp_path / "m"
    shutil.copytree(llama_dir.directory, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "mystery_knob": 3}))
    assert main(["hf", "import", str(d), str(tmp_path / "m.safetensors")]) == 0
    assert "warning: Llama: config.json fields not understood by specformer and ignored: mystery_knob" in capsys.readouterr().err


def test_families_lists_every_builtin(capsys):
    assert main(["hf", "families"]) == 0
    out = capsys.readouterr().out
    for model_type in ("gpt2", "gpt_neox", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo2"):
        assert f"\n{model_type} " in f"\n{out}"
