"""``specformer export gguf``: a checkpoint with its tokenizer and chat template to one file; refusals exit 2."""

from __future__ import annotations

import json

import gguf
import pytest

import specformer
from specformer.cli.main import main
from specformer_text import TOKENIZER_CONFIG_KEY, train_bpe

from fixtures.tiny import tiny_spec

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is fastest (tests/conftest.py)

TEMPLATE = "{% for m in messages %}<|bos|>{{ m['role'] }}: {{ m['content'] }}<|endoftext|>{% endfor %}"


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([*map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def fields(path) -> dict:
    return {name: field.contents() for name, field in gguf.GGUFReader(path).fields.items()}


def test_a_bpe_checkpoint_exports_its_vocabulary_merges_and_chat_template(capsys, tmp_path) -> None:
    tokenizer = train_bpe(["def main():\n    return 1\n" * 20, "the cat sat on the mat " * 20], vocab_size=300)
    ckpt = tmp_path / "bpe.safetensors"
    specformer.save(specformer.build(tiny_spec(vocab_size=tokenizer.vocab_size + 5), seed=0), ckpt,
                    metadata={"tokenizer": tokenizer.to_json(),
                              TOKENIZER_CONFIG_KEY: json.dumps({"chat_template": TEMPLATE})})
    code, _, err = cli(capsys, "export", "gguf", ckpt, tmp_path / "m.gguf", "--type", "q8_0")
    assert code == 0, err
    f = fields(tmp_path / "m.gguf")
    data = json.loads(tokenizer.inner.to_str())
    vocab = {i: t for t, i in tokenizer.inner.get_vocab(with_added_tokens=True).items()}
    n = tokenizer.vocab_size
    assert f[gguf.Keys.Tokenizer.LIST][:n] == [vocab[i] for i in range(n)]
    assert f[gguf.Keys.Tokenizer.LIST][n:] == [f"[PAD{i}]" for i in range(n, n + 5)]  # embedding rows past the end
    assert f[gguf.Keys.Tokenizer.TOKEN_TYPE][n:] == [gguf.TokenType.UNUSED] * 5
    assert f[gguf.Keys.Tokenizer.MERGES] == [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    assert len(f[gguf.Keys.Tokenizer.MERGES]) > 10
    assert f[gguf.Keys.Tokenizer.EOS_ID] == tokenizer.eot_id
    assert f[gguf.Keys.Tokenizer.CHAT_TEMPLATE] == TEMPLATE
    assert f[gguf.Keys.General.FILE_TYPE] == gguf.LlamaFileType.MOSTLY_Q8_0
    assert "wrote" in err and "chat template" in err


def test_a_spec_llama_cpp_cannot_run_is_refused_in_one_line_and_nothing_is_written(capsys, tmp_path) -> None:
    ckpt = tmp_path / "w.safetensors"
    spec = tiny_spec(vocab_size=259, block={"mixer": {"kind": "attention", "n_heads": 4, "window": 8}})
    specformer.save(specformer.build(spec, seed=0), ckpt, metadata={"tokenizer": json.dumps({"kind": "byte"})})
    code, _, err = cli(capsys, "export", "gguf", ckpt, tmp_path / "m.gguf")
    assert code == 2
    assert "model.block.mixer.window" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "m.gguf").exists()


def test_an_existing_output_needs_force(capsys, tmp_path) -> None:
    ckpt = tmp_path / "b.safetensors"
    specformer.save(specformer.build(tiny_spec(vocab_size=259), seed=0), ckpt,
                    metadata={"tokenizer": json.dumps({"kind": "byte"})})
    out = tmp_path / "m.gguf"
    out.write_text("old")
    assert cli(capsys, "export", "gguf", ckpt, out)[0] == 2
    assert out.read_text() == "old"
    code, _, err = cli(capsys, "export", "gguf", ckpt, out, "--force")
    assert code == 0, err
    assert fields(out)[gguf.Keys.General.ARCHITECTURE] == "llama"
