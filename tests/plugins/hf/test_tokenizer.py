"""tokenizer.json travels with the checkpoint: imported into the header, exported back unchanged.

A folder without one is recorded as having no tokenizer (text refused, ids fine); one from
elsewhere can be given at import or attached later; export writes the files transformers'
pipelines read (tokenizer_config.json, generation_config.json).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.cli.main import main
from specformer.errors import UserError
from specformer.tokenizers.tokenizer import NO_TOKENIZER_HINT, BPETokenizer, NoTokenizer, tokenizer_from_metadata

from fixtures.tiny import tiny_spec

TEXT = "the quick brown fox jumps over the lazy dog. " * 20


def _bpe(*special: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=100, special_tokens=list(special)))
    assert tokenizer.get_vocab_size() <= 100  # the test models have 128 embedding rows
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


# -- no tokenizer, --tokenizer, attach-tokenizer ---------------------------------------------------


def _no_tokenizer_checkpoint(llama_dir, tmp_path, capsys, *, eos_token_id=None):
    d = tmp_path / "plain"
    shutil.copytree(llama_dir.directory, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "eos_token_id": eos_token_id}))
    checkpoint = tmp_path / "plain.safetensors"
    assert main(["hf", "import", str(d), str(checkpoint)]) == 0
    captured = capsys.readouterr()
    return checkpoint, captured


def test_folder_without_tokenizer_warns_and_records_none(llama_dir, tmp_path, capsys):
    checkpoint, captured = _no_tokenizer_checkpoint(llama_dir, tmp_path, capsys, eos_token_id=5)
    assert "warning: " in captured.err and "has no tokenizer.json" in captured.err
    assert "--tokenizer PATH" in captured.err and "specformer hf attach-tokenizer" in captured.err
    assert "no tokenizer" in captured.out
    metadata = read_metadata(checkpoint)
    assert json.loads(metadata["tokenizer"]) == {"kind": "none", "vocab_size": 128, "eot_id": 5}
    stored = tokenizer_from_metadata(metadata)
    assert isinstance(stored, NoTokenizer) and stored.kind == "none" and stored.eot_id == 5
    for use in (lambda: stored.encode("hello"), lambda: stored.decode([1, 2])):
        with pytest.raises(UserError, match="has no tokenizer") as info:
            use()
        assert str(info.value) == NO_TOKENIZER_HINT and "attach-tokenizer" in NO_TOKENIZER_HINT
    # The export has no tokenizer files, and generation stops at the recorded end token.
    out = tmp_path / "hf"
    assert main(["hf", "export", str(checkpoint), str(out)]) == 0
    assert not (out / "tokenizer.json").exists() and not (out / "tokenizer_config.json").exists()
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 5
    # The rest is the source folder's generation_config.json, less the fields describing that file.
    source = json.loads((llama_dir.directory / "generation_config.json").read_text())
    assert {k: v for k, v in generation.items() if k != "eos_token_id"} == {
        k: v for k, v in source.items() if k not in ("eos_token_id", "transformers_version", "_from_model_config")}


def test_eos_id_outside_the_vocabulary_is_not_recorded(llama_dir, tmp_path, capsys):
    checkpoint, _ = _no_tokenizer_checkpoint(llama_dir, tmp_path, capsys, eos_token_id=128)
    assert json.loads(read_metadata(checkpoint)["tokenizer"]) == {"kind": "none", "vocab_size": 128}


def test_import_with_a_tokenizer_from_elsewhere(llama_dir, tmp_path, capsys):
    elsewhere = tmp_path / "tok"
    elsewhere.mkdir()
    tokenizer = _bpe("</s>")
    tokenizer.save(str(elsewhere / "tokenizer.json"))
    for given in (elsewhere / "tokenizer.json", elsewhere):  # the file, or a folder holding it
        checkpoint = tmp_path / f"m-{given.name}.safetensors"
        assert main(["hf", "import", str(llama_dir.directory), str(checkpoint), "--tokenizer", str(given),
                     "--eos-token", "</s>"]) == 0
        assert f"with the tokenizer from {given}" in capsys.readouterr().out
        stored = tokenizer_from_metadata(read_metadata(checkpoint))
        assert isinstance(stored, BPETokenizer) and stored.eot_id == tokenizer.token_to_id("</s>")
        assert stored.encode("the lazy dog") == tokenizer.encode("the lazy dog").ids


def _word_level(n_tokens: int, path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({f"w{i}": i for i in range(n_tokens - 1)} | {"<|endoftext|>": n_tokens - 1},
                               unk_token="w0")).save(str(path))
    return path


def test_bad_tokenizer_is_refused_before_the_weights(llama_dir, tmp_path, capsys):
    out = tmp_path / "m.safetensors"
    too_big = _word_level(200, tmp_path / "big.json")
    assert main(["hf", "import", str(llama_dir.directory), str(out), "--tokenizer", str(too_big)]) == 2
    err = capsys.readouterr().err
    assert "has 200 tokens but the model has only 128 embedding rows" in err and "Traceback" not in err
    assert main(["hf", "import", str(llama_dir.directory), str(out), "--tokenizer", str(tmp_path / "none.json")]) == 2
    assert "no such tokenizer file" in capsys.readouterr().err
    (tmp_path / "junk.json").write_text("{not a tokenizer")
    assert main(["hf", "import", str(llama_dir.directory), str(out), "--tokenizer", str(tmp_path / "junk.json")]) == 2
    assert "not a readable tokenizer.json" in capsys.readouterr().err
    assert not out.exists()


def test_attach_tokenizer_to_an_existing_checkpoint(llama_dir, tmp_path, capsys):
    checkpoint, _ = _no_tokenizer_checkpoint(llama_dir, tmp_path, capsys)
    before = read_metadata(checkpoint)
    tokenizer = _bpe("<unk>", "<|endoftext|>")
    tokenizer.save(str(tmp_path / "tokenizer.json"))

    assert main(["hf", "attach-tokenizer", str(checkpoint), str(tmp_path / "tokenizer.json")]) == 0
    assert "now stores the tokenizer" in capsys.readouterr().out
    after = read_metadata(checkpoint)
    assert {k: v for k, v in after.items() if k != "tokenizer"} == {k: v for k, v in before.items() if k != "tokenizer"}
    stored = tokenizer_from_metadata(after)
    assert isinstance(stored, BPETokenizer) and stored.eot_id == tokenizer.token_to_id("<|endoftext|>")
    model = specformer.load(checkpoint)
    for name, tensor in llama_dir.model.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left

    # A tokenizer is part of what a model means: replacing one needs --force.
    assert main(["hf", "attach-tokenizer", str(checkpoint), str(tmp_path / "tokenizer.json")]) == 2
    assert "already has a bpe tokenizer" in capsys.readouterr().err
    assert main(["hf", "attach-tokenizer", str(checkpoint), str(tmp_path / "tokenizer.json"), "--force",
                 "--eos-token", "<unk>"]) == 0
    assert tokenizer_from_metadata(read_metadata(checkpoint)).eot_id == tokenizer.token_to_id("<unk>")


def test_attach_tokenizer_without_an_end_token_asks_for_one(llama_dir, tmp_path, capsys):
    checkpoint, _ = _no_tokenizer_checkpoint(llama_dir, tmp_path, capsys)
    before = checkpoint.read_bytes()
    _bpe("<unk>").save(str(tmp_path / "tokenizer.json"))
    assert main(["hf", "attach-tokenizer", str(checkpoint), str(tmp_path / "tokenizer.json")]) == 2
    assert "name the end-of-text token with --eos-token TOKEN" in capsys.readouterr().err
    assert main(["hf", "attach-tokenizer", str(checkpoint), str(tmp_path / "tokenizer.json"), "--eos-token", "</s>"]) == 2
    assert "has no token '</s>'" in capsys.readouterr().err
    assert checkpoint.read_bytes() == before


def test_a_checkpoint_with_the_byte_tokenizer_keeps_it_unless_forced(tmp_path, capsys):
    spec = tiny_spec(vocab_size=259, d_model=16, n_layers=1, context_length=16,
                     block={"ffn": "swiglu", "mixer": {"kind": "attention", "n_heads": 2}})
    checkpoint = specformer.save(specformer.build(spec, seed=0), tmp_path / "c.safetensors",
                                 metadata={"tokenizer": json.dumps({"kind": "byte"})})
    _bpe("<|endoftext|>").save(str(tmp_path / "tokenizer.json"))
    assert main(["hf", "attach-tokenizer", str(checkpoint), str(tmp_path / "tokenizer.json")]) == 2
    assert "already has a byte tokenizer" in capsys.readouterr().err


# -- what export writes for transformers' pipelines ------------------------------------------------


def test_export_writes_tokenizer_and_generation_configs_that_transformers_loads(llama_dir, tmp_path):
    from transformers import AutoTokenizer, GenerationConfig, pipeline

    import specformer_hf

    d = tmp_path / "m"
    shutil.copytree(llama_dir.directory, d)
    tokenizer = _bpe("<|endoftext|>", "<|pad|>", "<|bos|>")  # specformer's own special tokens
    tokenizer.save(str(d / "tokenizer.json"))
    imported = specformer_hf.import_hf(d)  # the config names no token ids: they come from the tokenizer
    out = specformer_hf.to_hf(imported.model, tmp_path / "hf", tokenizer=imported.tokenizer)
    ids = {"bos_token_id": tokenizer.token_to_id("<|bos|>"), "eos_token_id": tokenizer.token_to_id("<|endoftext|>"),
           "pad_token_id": tokenizer.token_to_id("<|pad|>")}

    loaded = AutoTokenizer.from_pretrained(out)
    assert (loaded.eos_token, loaded.pad_token, loaded.bos_token) == ("<|endoftext|>", "<|pad|>", "<|bos|>")
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == tuple(ids.values())
    assert loaded("the lazy dog").input_ids == tokenizer.encode("the lazy dog").ids
    assert loaded.model_max_length == imported.model.spec.model.context_length
    generation = GenerationConfig.from_pretrained(out)
    assert {k: getattr(generation, k) for k in ids} == ids
    assert {k: json.loads((out / "config.json").read_text())[k] for k in ids} == ids

    # As it is, in a pipeline: the continuation is the one specformer's own greedy decoding gives.
    from specformer_generate import generate

    prompt = tokenizer.encode("the quick").ids
    expected = generate(imported.model, [prompt], max_new_tokens=6)[0][len(prompt):]
    pipe = pipeline("text-generation", model=str(out), tokenizer=str(out))
    text = pipe("the quick", max_new_tokens=6, min_new_tokens=6, do_sample=False, return_full_text=False)[0]["generated_text"]
    assert text == tokenizer.decode(expected)


def test_export_keeps_the_source_token_ids_over_the_tokenizers(llama_dir, tmp_path):
    d, tokenizer = _with_tokenizer(llama_dir, tmp_path, "</s>", eos_token_id=True)
    import specformer_hf

    imported = specformer_hf.import_hf(d)
    out = specformer_hf.to_hf(imported.model, tmp_path / "hf", tokenizer=imported.tokenizer)
    settings = json.loads((out / "tokenizer_config.json").read_text())
    assert settings["eos_token"] == "</s>" and "pad_token" not in settings and "bos_token" not in settings
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == tokenizer.token_to_id("</s>")
    assert "bos_token_id" not in generation and "pad_token_id" not in generation


def test_the_source_generation_config_is_exported_back(llama_dir, tmp_path, capsys):
    # Generation defaults (several end tokens, sampling settings) live in generation_config.json, not config.json.
    d = tmp_path / "m"
    shutil.copytree(llama_dir.directory, d)
    settings = {"eos_token_id": [3, 4], "temperature": 0.6, "top_p": 0.9, "do_sample": True,
                "transformers_version": "4.40.0"}
    (d / "generation_config.json").write_text(json.dumps(settings))
    checkpoint = tmp_path / "m.safetensors"
    assert main(["hf", "import", str(d), str(checkpoint)]) == 0
    out = tmp_path / "hf"
    assert main(["hf", "export", str(checkpoint), str(out)]) == 0
    from transformers import GenerationConfig

    loaded = GenerationConfig.from_pretrained(out)
    assert (loaded.eos_token_id, loaded.temperature, loaded.top_p, loaded.do_sample) == ([3, 4], 0.6, 0.9, True)
    assert "transformers_version" not in json.loads((out / "generation_config.json").read_text())


def test_a_broken_generation_config_is_ignored_with_a_warning(llama_dir, tmp_path):
    import specformer_hf

    d = tmp_path / "m"
    shutil.copytree(llama_dir.directory, d)
    (d / "generation_config.json").write_text("[1, 2]")
    with pytest.warns(UserWarning, match="generation_config.json: ignored, not a usable generation_config.json"):
        imported = specformer_hf.import_hf(d)
    assert imported.generation_config is None and "hf.generation_config" not in imported.metadata()


def test_the_source_tokenizer_config_travels_with_its_tokenizer(llama_dir, tmp_path):
    # A chat template and padding side live in tokenizer_config.json; an export must keep them.
    from transformers import AutoTokenizer

    d, tokenizer = _with_tokenizer(llama_dir, tmp_path, "</s>", eos_token_id=True)
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": template, "padding_side": "left",
        "eos_token": "</s>", "model_max_length": 1000}))
    checkpoint = tmp_path / "m.safetensors"
    assert main(["hf", "import", str(d), str(checkpoint)]) == 0
    out = tmp_path / "hf"
    assert main(["hf", "export", str(checkpoint), str(out)]) == 0
    loaded = AutoTokenizer.from_pretrained(out)
    assert loaded.padding_side == "left" and loaded.model_max_length == 1000
    chat = loaded.apply_chat_template([{"role": "user", "content": "the fox"}], tokenize=False)
    assert chat == "<user>the fox</s>"

    # Attaching another tokenizer drops the settings that described the old one.
    _bpe("<|endoftext|>").save(str(tmp_path / "other.json"))
    assert main(["hf", "attach-tokenizer", str(checkpoint), str(tmp_path / "other.json"), "--force",
                 "--eos-token", "<|endoftext|>"]) == 0
    assert "hf.tokenizer_config" not in read_metadata(checkpoint)
    again = tmp_path / "hf2"
    assert main(["hf", "export", str(checkpoint), str(again)]) == 0
    assert "chat_template" not in json.loads((again / "tokenizer_config.json").read_text())


def test_a_chat_template_saved_beside_the_tokenizer_config_is_kept(llama_dir, tmp_path):
    from transformers import AutoTokenizer

    import specformer_hf

    d, _ = _with_tokenizer(llama_dir, tmp_path, "</s>", eos_token_id=True)
    (d / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    imported = specformer_hf.import_hf(d)
    out = specformer_hf.to_hf(imported.model, tmp_path / "hf", tokenizer=imported.tokenizer)
    loaded = AutoTokenizer.from_pretrained(out)
    assert loaded.apply_chat_template([{"role": "user", "content": "fox"}], tokenize=False) == "[fox]"
