"""``specformer train --init`` and ``train.adapter``: what changes, what is saved, resuming, merging."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

import specformer
from specformer.cli.main import main
from specformer.errors import UserError
from specformer_train import train
from specformer_train.init_weights import load_init

from .conftest import tiny_finetune_spec

ADAPTER = {"kind": "lora", "rank": 4, "alpha": 8, "targets": ["blocks.*.mixer.*", "blocks.*.ffn.down"]}


def _keys(path: Path) -> set[str]:
    with safe_open(str(path), "pt") as f:
        return set(f.keys())


def test_adapter_run_changes_only_the_adapter(tmp_path: Path, base_ckpt: Path, text_file: Path) -> None:
    result = train(tiny_finetune_spec(adapter=ADAPTER), data=str(text_file), out_dir=str(tmp_path / "run"),
                   init=str(base_ckpt))
    assert result.status == "finished" and result.model_path is not None
    stored = _keys(result.model_path)
    assert stored and all(k.rsplit(".", 1)[-1] in ("lora_A", "lora_B") for k in stored)
    assert _keys(result.checkpoint / "model.safetensors") == stored
    header = json.loads(specformer.checkpoint.save_load.read_metadata(result.model_path)["adapter"])
    assert header["base"]["path"] == str(base_ckpt.resolve()) and len(header["base"]["sha256"]) == 64

    base = specformer.load(base_ckpt).state_dict()
    tuned = specformer.load(result.model_path)
    for name, tensor in tuned.state_dict().items():
        if "lora_" in name:
            continue
        assert torch.equal(tensor, base[name.replace(".base.", ".")]), name  # the base is bit-identical
    assert any(tensor.abs().sum() > 0 for name, tensor in tuned.state_dict().items() if name.endswith("lora_B"))

    # The metrics say what the optimizer moved, of what there is (the first train record of the run).
    first = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    lora = sum(t.numel() for name, t in tuned.state_dict().items() if "lora_" in name)
    assert first["trainable_params"] == lora and first["params"] == sum(t.numel() for t in tuned.parameters())


def test_resumed_adapter_run_equals_an_uninterrupted_one(tmp_path: Path, base_ckpt: Path, text_file: Path) -> None:
    whole = train(tiny_finetune_spec(adapter=ADAPTER), data=str(text_file), out_dir=str(tmp_path / "a"),
                  init=str(base_ckpt))
    # The run "b" stopped after its step-3 checkpoint: a copy of the uninterrupted run's.
    shutil.copytree(tmp_path / "a" / "checkpoints" / "step-0000003", tmp_path / "b" / "checkpoints" / "step-0000003")
    (tmp_path / "b" / "checkpoints" / "latest").write_text("step-0000003")
    resumed = train(tiny_finetune_spec(adapter=ADAPTER), data=str(text_file), out_dir=str(tmp_path / "b"),
                    init=str(base_ckpt), resume=True)
    a = specformer.load(whole.model_path).state_dict()
    b = specformer.load(resumed.model_path).state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_merge_command_writes_a_plain_checkpoint_with_the_adapter_logits(tmp_path: Path, base_ckpt: Path,
                                                                         text_file: Path) -> None:
    result = train(tiny_finetune_spec(adapter=ADAPTER), data=str(text_file), out_dir=str(tmp_path / "run"),
                   init=str(base_ckpt))
    out = tmp_path / "merged.safetensors"
    assert main(["merge", str(result.model_path), "-o", str(out)]) == 0
    assert not any("lora" in k for k in _keys(out))
    x = torch.randint(0, 259, (2, 24))
    adapted = specformer.load(result.model_path).eval()
    merged = specformer.load(out).eval()
    torch.testing.assert_close(merged(x), adapted(x), rtol=1e-5, atol=1e-5)
    assert main(["merge", str(base_ckpt), "-o", str(tmp_path / "x.safetensors")]) == 2  # not an adapter


def test_full_fine_tune_starts_from_the_checkpoint_weights(tmp_path: Path, base_ckpt: Path) -> None:
    from specformer.spec.check import check_spec

    started = load_init(str(base_ckpt), check_spec(tiny_finetune_spec()).spec)
    saved = specformer.load(base_ckpt).state_dict()
    assert started.model.state_dict().keys() == saved.keys()
    assert all(torch.equal(started.model.state_dict()[k], saved[k]) for k in saved)
    assert json.loads(started.tokenizer.to_json()) == {"kind": "byte"}


def test_init_refuses_a_spec_of_another_model(tmp_path: Path, base_ckpt: Path, text_file: Path) -> None:
    spec = tiny_finetune_spec()
    spec["model"]["d_model"] = 48
    with pytest.raises(UserError, match=r"model\.d_model: spec 48, checkpoint 32"):
        train(spec, data=str(text_file), out_dir=str(tmp_path / "run"), init=str(base_ckpt))


def test_adapter_without_init_is_refused_before_any_data_is_read(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="set train.init"):
        train(tiny_finetune_spec(adapter=ADAPTER), data=str(tmp_path / "missing.txt"), out_dir=str(tmp_path / "run"))


def test_cli_init_flag(tmp_path: Path, base_ckpt: Path, text_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = tmp_path / "tiny.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_finetune_spec(steps=2, save_every=0, eval_every=0, adapter="lora")))
    code = main(["train", str(spec_path), "--data", str(text_file), "--out", str(tmp_path / "run"),
                 "--init", str(base_ckpt)])
    assert code == 0
    err = capsys.readouterr().out
    assert "trains  " in err and "of 29," in err or "parameters (" in err


def test_adapter_run_on_chat_data(tmp_path: Path, base_ckpt: Path, chat_file: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    result = train(tiny_finetune_spec(adapter=ADAPTER, chat_template="chatml"), data=str(chat_file),
                   out_dir=str(tmp_path / "run"), init=str(base_ckpt))
    assert result.status == "finished" and result.val_loss is not None
    assert "120 conversations, loss on replies only" in capsys.readouterr().out


def test_chat_template_on_plain_text_is_refused(tmp_path: Path, base_ckpt: Path, text_file: Path) -> None:
    with pytest.raises(UserError, match="is not chat data"):
        train(tiny_finetune_spec(chat_template="chatml"), data=str(text_file), out_dir=str(tmp_path / "run"),
              init=str(base_ckpt))


def test_a_runaway_chat_template_stops_train_with_one_line(tmp_path: Path, base_ckpt: Path, chat_file: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    template = tmp_path / "runaway.jinja"
    template.write_text("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}")
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_finetune_spec(adapter=ADAPTER, chat_template=str(template))))
    code = main(["train", str(spec_path), "--data", str(chat_file), "--out", str(tmp_path / "run"),
                 "--init", str(base_ckpt)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "the chat template ran longer than its time bound of 1 s" in err, err


GOOD_RECORD = json.dumps({"messages": [{"role": "user", "content": "what is 1 plus one?"},
                                       {"role": "assistant", "content": "2."}]}).encode()

#: (bytes of the bad line, its line number, words the one-line error must hold)
HOSTILE_CHAT = [
    (b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 1, "line 1: nested too deeply to read"),
    (GOOD_RECORD + b"\n" + b"[" * 100_000 + b"]" * 100_000, 2, "line 2: nested too deeply to read"),
    (GOOD_RECORD + b'\n{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b\\ud800"}]}',
     2, "line 2: messages[1].content holds the lone surrogate escape \\ud800 at character 1"),
    (GOOD_RECORD + b'\n{"prompt": "\\udfff", "completion": "b"}', 2,
     "line 2: prompt holds the lone surrogate escape \\udfff at character 0"),
    (GOOD_RECORD + b'\n{"prompt": "a\xff", "completion": "b"}', 2, "line 2: not UTF-8 text (byte 14 of the line"),
]


@pytest.mark.parametrize("streaming", [False, True], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("content, line, words", HOSTILE_CHAT, ids=["deep-first", "deep", "surrogate", "surrogate-prompt",
                                                                     "not-utf8"])
def test_a_hostile_chat_line_stops_train_with_one_line_naming_it(tmp_path: Path, base_ckpt: Path, chat_file: Path,
                                                                 capsys: pytest.CaptureFixture[str], content: bytes,
                                                                 line: int, words: str, streaming: bool) -> None:
    data = tmp_path / "hostile.jsonl"
    data.write_bytes(content + b"\n" + chat_file.read_bytes())
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_finetune_spec(adapter=ADAPTER, chat_template="chatml", streaming=streaming,
                                                           steps=2, eval_every=0, save_every=0)))
    code = main(["train", str(spec_path), "--data", str(data), "--out", str(tmp_path / "run"), "--init", str(base_ckpt)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert f"{data}, {words}" in err, err


@pytest.mark.parametrize("streaming", [False, True], ids=["in-memory", "streamed"])
def test_a_chat_file_starting_with_a_byte_order_mark_is_chat_data(tmp_path: Path, base_ckpt: Path, chat_file: Path,
                                                                  capsys: pytest.CaptureFixture[str],
                                                                  streaming: bool) -> None:
    data = tmp_path / "bom.jsonl"
    data.write_bytes(b"\xef\xbb\xbf" + chat_file.read_bytes())
    spec = tiny_finetune_spec(adapter=ADAPTER, chat_template="chatml", streaming=streaming, steps=2, eval_every=0,
                              save_every=0)
    result = train(spec, data=str(data), out_dir=str(tmp_path / "run"), init=str(base_ckpt))
    assert result.status == "finished"
    if not streaming:
        assert "120 conversations, loss on replies only" in capsys.readouterr().out
