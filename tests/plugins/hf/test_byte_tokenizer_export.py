"""The byte tokenizer survives ``hf export`` (a tokenizer.json transformers loads) and comes back from ``hf import``.

Checked against specformer's own :class:`~specformer.tokenizers.tokenizer.ByteTokenizer` on text of
several scripts, emoji, control characters and the special tokens' strings, and on
random ids (invalid UTF-8 included) for decoding.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml

import specformer
from specformer.tokenizers.byte_file import byte_tokenizer_json, is_byte_tokenizer_json
from specformer.checkpoint.save_load import read_metadata
from specformer.cli.main import main
from specformer.tokenizers.tokenizer import METADATA_KEY, SPECIAL_TOKENS, ByteTokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

SPECS = Path(__file__).resolve().parents[3] / "specs"
BYTES = ByteTokenizer()

#: Pieces of text random strings are made of: scripts, emoji (with modifiers and joiners), controls, specials.
PIECES = [
    "def f(x):\n\treturn x", "  two leading spaces", "Grüße, café, naïve", "Ελληνικά", "Русский текст",
    "日本語のテキスト", "中文", "한국어", "العربية", "हिन्दी", "ไทย", "😀", "👍🏽", "👩‍👩‍👧", "🇫🇷", "\u00a0\u200b\ufeff",
    "\x00\x01\x1f\x7f", "\r\n", "e\u0301",  # a combining accent: no normalisation may fold it
    *SPECIAL_TOKENS, "<|endoftext|>x<|pad|>",
]


def random_texts(n: int, *, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 6))) for _ in range(n)]


@pytest.fixture(scope="module")
def demo_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model (specs/tiny.yaml: byte tokenizer, 259 ids) saved as training saves it."""
    model_section = yaml.safe_load((SPECS / "tiny.yaml").read_text(encoding="utf-8"))["model"]
    model = specformer.build({"model": copy.deepcopy(model_section)}, seed=0)
    path = tmp_path_factory.mktemp("demo") / "model.safetensors"
    return specformer.save(model, path, metadata={METADATA_KEY: BYTES.to_json()})


@pytest.fixture(scope="module")
def exported(demo_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "hf"
    assert main(["hf", "export", str(demo_checkpoint), str(out)]) == 0
    return out


def test_transformers_encodes_as_specformer(exported: Path) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(str(exported))
    for text in random_texts(200, seed=0) + PIECES:
        assert hf.encode(text) == BYTES.encode(text), text
        assert hf(text)["input_ids"] == BYTES.encode(text), text  # the call form adds nothing either
        assert hf.decode(hf.encode(text)) == text


def test_transformers_decodes_any_ids_as_specformer(exported: Path) -> None:
    """Random ids: cut characters and invalid bytes become U+FFFD the same way; special tokens are skipped."""
    hf = transformers.AutoTokenizer.from_pretrained(str(exported))
    rng = random.Random(1)
    for _ in range(500):
        ids = [rng.randrange(BYTES.vocab_size) for _ in range(rng.randrange(0, 16))]
        assert hf.decode(ids, skip_special_tokens=True) == BYTES.decode(ids), ids
    invalid = [0xC3, 0x28, 0xE2, 0x82, 0xF0, 0x80, 0x80, 0xFF, 0xED, 0xA0, 0x80, 0xF4, 0x90, 0x80, 0x80, 0xE2, 0x82]
    assert hf.decode(invalid) == BYTES.decode(invalid)


def test_the_bare_tokenizers_library_agrees_once_told_to_split_special_tokens(exported: Path) -> None:
    inner = tokenizers.Tokenizer.from_file(str(exported / "tokenizer.json"))
    inner.encode_special_tokens = True  # tokenizer.json cannot record it; tokenizer_config.json does for transformers
    for text in random_texts(50, seed=2):
        assert inner.encode(text).ids == BYTES.encode(text), text


def test_special_tokens_and_token_ids_in_the_configs(exported: Path) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(str(exported))
    assert (hf.eos_token, hf.eos_token_id) == ("<|endoftext|>", BYTES.eot_id)
    assert (hf.bos_token, hf.bos_token_id) == ("<|bos|>", BYTES.bos_id)
    assert (hf.pad_token, hf.pad_token_id) == ("<|pad|>", BYTES.pad_id)
    assert hf.decode([BYTES.eot_id]) == "<|endoftext|>"  # transformers' default keeps special tokens as text
    settings = json.loads((exported / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast" and settings["split_special_tokens"] is True
    for name in ("config.json", "generation_config.json"):
        config = json.loads((exported / name).read_text())
        assert (config["eos_token_id"], config["bos_token_id"], config["pad_token_id"]) == (256, 258, 257), name
    assert json.loads((exported / "tokenizer.json").read_text()) == byte_tokenizer_json()


def test_import_of_the_export_gives_the_byte_tokenizer_back(exported: Path, demo_checkpoint: Path,
                                                            tmp_path: Path) -> None:
    back = tmp_path / "back.safetensors"
    assert main(["hf", "import", str(exported), str(back)]) == 0
    assert json.loads(read_metadata(back)[METADATA_KEY]) == json.loads(read_metadata(demo_checkpoint)[METADATA_KEY])
    assert json.loads(read_metadata(back)[METADATA_KEY]) == {"kind": "byte"}
    again = tmp_path / "again"
    assert main(["hf", "export", str(back), str(again)]) == 0  # and out again, the same files
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((again / name).read_text()) == json.loads((exported / name).read_text()), name


def test_a_checkpoint_without_a_tokenizer_entry_exports_the_byte_tokenizer(demo_checkpoint: Path,
                                                                           tmp_path: Path) -> None:
    """``specformer.save(specformer.build(...))`` of a 259-token model: byte-level, as every command reads it."""
    bare = specformer.save(specformer.load(demo_checkpoint), tmp_path / "bare.safetensors")
    assert METADATA_KEY not in read_metadata(bare)
    out = tmp_path / "hf"
    assert main(["hf", "export", str(bare), str(out)]) == 0
    assert json.loads((out / "tokenizer.json").read_text()) == byte_tokenizer_json()


def test_a_resaved_copy_is_still_recognised(exported: Path, tmp_path: Path) -> None:
    """transformers writes tokenizer.json again in its own layout; it is still the byte tokenizer."""
    transformers.AutoTokenizer.from_pretrained(str(exported)).save_pretrained(str(tmp_path))
    assert is_byte_tokenizer_json(json.loads((tmp_path / "tokenizer.json").read_text()))


def _with(change: Any) -> dict[str, Any]:
    data = byte_tokenizer_json()
    change(data)
    return data


@pytest.mark.parametrize("name, changed", [
    ("a merge", _with(lambda d: d["model"]["merges"].append(["a", "b"]))),
    ("a byte at another id", _with(lambda d: d["model"]["vocab"].update({"a": 98, "b": 97}))),
    ("a normaliser", _with(lambda d: d.update(normalizer={"type": "NFC"}))),
    ("a prefix space", _with(lambda d: d["pre_tokenizer"].update(add_prefix_space=True))),
    ("a post-processor adding a token", _with(lambda d: d.update(post_processor={
        "type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|bos|>", "type_id": 0}},
                                                 {"Sequence": {"id": "A", "type_id": 0}}]}))),
    ("another decoder", _with(lambda d: d.update(decoder={"type": "Fuse"}))),
    ("another special token", _with(lambda d: d["added_tokens"][0].update(content="</s>"))),
    ("an extra added token", _with(lambda d: d["added_tokens"].append({"id": 259, "content": "<x>"}))),
    ("a WordPiece model", _with(lambda d: d["model"].update(type="WordPiece"))),
])
def test_other_tokenizers_are_not_taken_for_the_byte_tokenizer(name: str, changed: dict[str, Any]) -> None:
    assert is_byte_tokenizer_json(byte_tokenizer_json())
    assert not is_byte_tokenizer_json(changed), name
