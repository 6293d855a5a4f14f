"""``specformer eval`` on an imported Hugging Face model: its loss equals transformers' for the same text."""

from __future__ import annotations

import json
import math

import pytest
import torch

from specformer.cli.main import main

from .support import BYTES, DOCUMENTS

transformers = pytest.importorskip("transformers", reason="transformers is a test-only dependency")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """A tiny random Llama over 259 ids, saved by transformers and imported by ``specformer hf import``."""
    folder = tmp_path_factory.mktemp("hf")
    config = transformers.LlamaConfig(vocab_size=259, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # norms away from 1, so a misplaced weight shows
    hf.eval().save_pretrained(folder / "llama")
    checkpoint = folder / "llama.safetensors"
    assert main(["hf", "import", str(folder / "llama"), str(checkpoint)]) == 0
    (folder / "bytes.json").write_text(BYTES.to_json())  # the folder had no tokenizer.json: bytes, given by hand
    return hf, checkpoint, folder / "bytes.json"


def transformers_nll(hf, sequence: list[int], *, context: int, stride: int) -> tuple[float, int]:
    """The Hugging Face perplexity guide's loop: labels -100 on the history, the model's own loss."""
    total, count, done, end = 0.0, 0, 0, context
    last = len(sequence) - 1
    while done < last:
        end = min(end, last)
        start = max(0, end - context)
        ids = torch.tensor([sequence[start : end + 1]])
        labels = ids.clone()
        labels[:, : ids.shape[1] - (end - done)] = -100  # score only the targets after `done`
        with torch.no_grad():
            loss = hf(input_ids=ids, labels=labels).loss.double().item()
        total += loss * (end - done)
        count += end - done
        done, end = end, end + stride
    return total, count


@pytest.mark.parametrize("context,stride", [(64, 64), (24, 8)])
def test_loss_equals_transformers(capsys, tmp_path, imported, context, stride):
    hf, checkpoint, tokenizer = imported
    data = tmp_path / "data"
    data.mkdir()
    for i, text in enumerate(DOCUMENTS):
        (data / f"{i}.txt").write_text(text, encoding="utf-8")
    code = main(["eval", str(checkpoint), "--data", str(data), "--tokenizer", str(tokenizer), "--json",
                 "--context", str(context), "--stride", str(stride)])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    total = count = 0
    for text in DOCUMENTS:
        if text:
            nll, n = transformers_nll(hf, [BYTES.eot_id, *BYTES.encode(text)], context=context, stride=stride)
            total, count = total + nll, count + n
    assert report["tokens"] == count
    assert abs(report["loss"] - total / count) < 1e-5
    assert report["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-5)


def test_an_import_without_tokenizer_is_refused_with_how_to_attach_one(capsys, tmp_path, imported):
    _, checkpoint, _ = imported
    (tmp_path / "a.txt").write_text("some text")
    code = main(["eval", str(checkpoint), "--data", str(tmp_path / "a.txt")])
    _, err = capsys.readouterr()
    assert code == 2 and "has no tokenizer" in err and "--tokenizer" in err and "Traceback" not in err
