"""tokenizer.json travels with the checkpoint: imported into the header, exported back unchanged."""

from __future__ import annotations

import json
import shutil

import pytest

import specformer
from specformer.checkpoint import read_metadata
from specformer.cli import main
from specformer.tokenizer import BPETokenizer, tokenizer_from_metadata

TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def _bpe(special: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=100, special_tokens=[special]))
    return tokenizer


def _with_tokenizer(llama_dir, tmp_path, special, eos_token_id):
    d = tmp_path / "m"
    shutil.copytree(llama_dir.directory, d)
    tokenizer = _bpe(special)
    tokenizer.save(str(d / "tokenizer.json"))
    config = json.loads((d / "config.json").read_text())
    config["eos_token_id"] = tokenizer.token_to_id(special) if eos_token_id else None
    (d / "config.json").write_text(json.dumps(config))
    return d, tokenizer


def test_tokenizer_is_stored_with_the_eos_of_the_config_and_exported_back(llama_dir, tmp_path):
    d, tokenizer = _with_tokenizer(llama_dir, tmp_path, "</s>", eos_token_id=True)
    checkpoint = tmp_path / "m.safetensors"
    assert main(["hf", "import", str(d), str(checkpoint)]) == 0
    stored = tokenizer_from_metadata(read_metadata(checkpoint))
    assert isinstance(stored, BPETokenizer)
    assert stored.eot_id == tokenizer.token_to_id("</s>")
    assert stored.encode("the lazy fox") == tokenizer.encode("the lazy fox").ids

    out = tmp_path / "hf"
    assert main(["hf", "export", str(checkpoint), str(out)]) == 0
    assert json.loads((out / "tokenizer.json").read_text()) == json.loads((d / "tokenizer.json").read_text())
    assert json.loads((out / "config.json").read_text())["eos_token_id"] == tokenizer.token_to_id("</s>")


def test_endoftext_token_is_used_when_the_config_names_no_eos(llama_dir, tmp_path):
    import specformer_hf

    d, tokenizer = _with_tokenizer(llama_dir, tmp_path, "<|endoftext|>", eos_token_id=False)
    imported = specformer_hf.import_hf(d)
    assert imported.tokenizer.eot_id == tokenizer.token_to_id("<|endoftext|>")


def test_tokenizer_without_any_end_token_is_reported_and_recorded_as_none(llama_dir, tmp_path):
    import specformer_hf

    d, tokenizer = _with_tokenizer(llama_dir, tmp_path, "<unk>", eos_token_id=False)
    with pytest.warns(UserWarning, match="cannot tell where documents end.*records that it has no tokenizer"):
        imported = specformer_hf.import_hf(d)
    assert not imported.has_tokenizer
    assert json.loads(imported.metadata()["tokenizer"]) == {"kind": "none", "vocab_size": 128}
    # Naming the end token makes it usable.
    named = specformer_hf.import_hf(d, eos_token="<unk>")
    assert named.has_tokenizer and named.tokenizer.eot_id == tokenizer.token_to_id("<unk>")
