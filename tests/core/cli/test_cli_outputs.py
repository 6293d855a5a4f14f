"""Every command that writes files follows one rule (:mod:`specformer.files.outputs`), tried through the CLI.

Each registered command (plugins' included) is classified below: either it writes files,
named by which argument and how (a file, a folder, a checkpoint rewritten in place), or
it writes none. A command missing from the table fails the first test, so a new command
cannot skip the rule. Every writer is then run in-process against

- an output that already exists, without ``--force``: exit 2, the output unchanged;
- an output that is one of its inputs, however named (the same path, ``./``, ``a/../a``,
  a symbolic link, a hard link), with ``--force``: exit 2, the input unchanged;
- a successful write: no temporary sibling left, files and folders with the umask's modes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from conftest import REPO
from fixtures.tiny import tiny_spec

import specformer
from specformer.cli.main import main, make_parser
from specformer.tokenizers.tokenizer import METADATA_KEY, ByteTokenizer


def _hf_forge():
    """The hf plugin tests' hand-forged Hugging Face folders (loaded by path, as their conftest does)."""
    if "hf_forge" not in sys.modules:
        spec = importlib.util.spec_from_file_location("hf_forge", REPO / "tests" / "plugins" / "hf" / "hf_forge.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["hf_forge"] = module
        spec.loader.exec_module(module)
    return sys.modules["hf_forge"]


# -- the inputs every case reads, made once ----------------------------------------------------


@dataclass
class Workspace:
    float_ckpt: Path  # the tiny model with byte vocabulary and tokenizer
    spec: Path  # its spec, for train
    corpus: Path
    hf_dir: Path  # a forged one-layer Llama folder
    base: Path  # that folder imported (no tokenizer)
    adapter: Path  # a LoRA adapter checkpoint on the base
    peft_dir: Path  # the adapter exported as a PEFT folder
    tokenizer: Path  # a tokenizer.json that fits the base


BYTE_MODEL = tiny_spec(vocab_size=259)  # the tiny model, byte tokens
LORA = {"kind": "lora", "rank": 2, "alpha": 4, "targets": ["blocks.*.mixer.*"]}
TRAIN = ["--steps", "1", *(item for setting in ("batch_size=2", "val_fraction=0", "eval_every=0", "save_every=0",
                                                 "sample_tokens=0", "progress=false", "plot=false", "tensorboard=false",
                                                 "threads=1") for item in ("--set", f"train.{setting}"))]


def make_adapter(base: Path, path: Path) -> Path:
    from specformer_finetune.adapter_file import base_reference, save_adapter
    from specformer_finetune.apply import apply_adapter

    model = specformer.load(base)
    apply_adapter(model, LORA).base = base_reference(base)
    return save_adapter(model, path)


@pytest.fixture(scope="module")
def w(tmp_path_factory) -> Workspace:
    from tokenizers import Tokenizer, models

    root = tmp_path_factory.mktemp("inputs")
    float_ckpt = specformer.save(specformer.build(BYTE_MODEL, seed=0), root / "float.safetensors",
                                 metadata={METADATA_KEY: ByteTokenizer().to_json()})
    spec = root / "tiny.yaml"
    spec.write_text(yaml.safe_dump(BYTE_MODEL))
    corpus = root / "corpus.txt"
    corpus.write_text("a few words of text to train on, again and again\n" * 40)
    hf_dir = _hf_forge().llama_folder(root / "llama")
    base = root / "base.safetensors"
    assert main(["hf", "import", str(hf_dir), str(base)]) == 0
    adapter = make_adapter(base, root / "adapter.safetensors")
    assert main(["peft", "export", str(adapter), str(root / "peft")]) == 0
    tokenizer = root / "tokenizer.json"
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(7)} | {"<|endoftext|>": 7}, unk_token="w0")).save(str(tokenizer))
    return Workspace(float_ckpt, spec, corpus, hf_dir, base, adapter, root / "peft", tokenizer)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPECFORMER_CACHE", str(tmp_path_factory.mktemp("cache")))  # train's token cache


# -- the table -------------------------------------------------------------------------------------


def _no_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    return []


@dataclass(frozen=True)
class Clash:
    """An output named as one of the command's inputs: ``argv(spelling)`` names ``target`` as ``spelling``
    (with ``--force``, or what the command has instead)."""

    target: Path  # the input itself, or the folder holding it
    argv: Callable[[str], list[str]]
    protected: Path  # the input that must come through unchanged
    #: Whether a hard link of ``target`` is the output too: not when the output is a folder that only holds
    #: one name of the input (deleting that name loses nothing).
    hard_link: bool = True


@dataclass(frozen=True)
class Writer:
    """How a command writes: ``write(w, out)`` is its command line writing the output at ``out``."""

    output: str  # the argument naming the output (an option, or a positional's dest)
    write: Callable[[Workspace, Path], list[str]]
    folder: bool = False
    force: str = "--force"
    suffix: str = ".safetensors"
    #: What a successful write needs at ``out`` first (nothing for a new file or folder).
    ready: Callable[[Workspace, Path], None] | None = None
    #: Something already at ``out``, which only ``force`` may replace (default: a file, or a folder holding one).
    existing: Callable[[Workspace, Path], None] | None = None
    #: The ways this command could be asked to write over an input, given a scratch folder.
    clashes: Callable[[Workspace, Path], list[Clash]] = _no_clashes


def _copy(source: Path, target: Path) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target


def _file_clash(target: Path, argv: Callable[[str], list[str]], *, hard_link: bool = True) -> Clash:
    return Clash(target=target, argv=argv, protected=target, hard_link=hard_link)


def _folder_clash(protected: Path, argv: Callable[[str], list[str]]) -> Clash:
    return Clash(target=protected.parent, argv=argv, protected=protected)


def _quantize_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    ckpt = _copy(w.float_ckpt, scratch / "float.safetensors")
    return [_file_clash(ckpt, lambda out: ["quantize", str(ckpt), "--method", "int8", "-o", out, "--force"])]


def _merge_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    base = _copy(w.base, scratch / "base.safetensors")
    adapter = make_adapter(base, scratch / "adapter.safetensors")
    return [_file_clash(adapter, lambda out: ["merge", str(adapter), "-o", out, "--force"]),
            _file_clash(base, lambda out: ["merge", str(adapter), "-o", out, "--force"])]


def _import_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    folder = scratch / "llama"
    shutil.copytree(w.hf_dir, folder)
    _copy(w.tokenizer, scratch / "tok" / "tokenizer.json")
    return [
        _file_clash(folder / "model.safetensors", lambda out: ["hf", "import", str(folder), out, "--force"]),
        _file_clash(folder / "config.json", lambda out: ["hf", "import", str(folder), str(scratch / "m.safetensors"),
                                                        "--spec-out", out, "--force"]),
        _file_clash(scratch / "tok" / "tokenizer.json",
                    lambda out: ["hf", "import", str(folder), str(scratch / "m.safetensors"), "--spec-out", out,
                                 "--tokenizer", str(scratch / "tok"), "--force"]),
    ]


def _peft_import_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    return [_file_clash(_copy(w.base, scratch / "base.safetensors"),
                        lambda out: ["peft", "import", str(w.peft_dir), out, "--base", str(scratch / "base.safetensors"),
                                     "--force"])]


def _export_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    ckpt = _copy(w.float_ckpt, scratch / "held" / "float.safetensors")
    base = _copy(w.base, scratch / "base-here" / "base.safetensors")
    adapter = make_adapter(base, scratch / "adapter.safetensors")  # beside the folder: only its base is inside
    return [_folder_clash(ckpt, lambda out: ["hf", "export", str(ckpt), out, "--force"]),
            _folder_clash(base, lambda out: ["peft", "export", str(adapter), out, "--force"])]


def _attach_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    ckpt = _copy(w.base, scratch / "base.safetensors")
    return [_file_clash(ckpt, lambda tokenizer: ["hf", "attach-tokenizer", str(ckpt), tokenizer, "--force"])]


def _inspect_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    ckpt = _copy(w.float_ckpt, scratch / "held" / "float.safetensors")
    tokenizer = _copy(w.tokenizer, scratch / "tok-here" / "tokenizer.json")
    return [_folder_clash(ckpt, lambda out: ["inspect", str(ckpt), "--prompt", "ab", "--out", out, "--force"]),
            _folder_clash(tokenizer, lambda out: ["inspect", str(ckpt), "--prompt", "ab", "--out", out,
                                                  "--tokenizer", str(tokenizer), "--force"])]


def _train(w: Workspace, out: str, *extra: str) -> list[str]:
    return ["train", str(w.spec), "--data", str(w.corpus), "--out", out, *TRAIN, *extra]


def _train_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    run = scratch / "run"
    model = _copy(w.float_ckpt, run / "model.safetensors")  # a finished run's model, fine-tuned from
    corpus = _copy(w.corpus, run / "checkpoints" / "corpus.txt")  # where a run prunes
    return [
        _folder_clash(model, lambda out: _train(w, out, "--init", str(model), "--overwrite")),
        _file_clash(model, lambda init: _train(w, str(run), "--init", init, "--overwrite")),
        _file_clash(model, lambda init: _train(w, str(run), "--init", init, "--resume")),
        _file_clash(corpus, lambda data: _train(w, str(run), "--data", data, "--overwrite"), hard_link=False),
    ]


def _earlier_run(w: Workspace, out: Path) -> None:
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"an earlier run's model")


def _checkpoint_with_a_tokenizer(w: Workspace, out: Path) -> None:
    _copy(w.float_ckpt, out)  # stores the byte tokenizer: replacing it needs --force


def _sharded_checkpoint(w: Workspace) -> Path:
    """A one-process sharded training checkpoint of the tiny model (made once, beside the workspace's inputs)."""
    from specformer_train.checkpointing import TrainerState, save_checkpoint
    from specformer_train.config import TrainSpec
    from specformer_train.parallel.layout import ParallelLayout
    from specformer_train.optim import make_optimizer

    found = w.float_ckpt.parent / "sharded" / "checkpoints" / "step-0000001"
    if not found.is_dir():
        model = specformer.build(BYTE_MODEL, seed=0)
        optimizer = make_optimizer(model, TrainSpec(), device=torch.device("cpu"))
        save_checkpoint(out_dir=found.parents[1], model=model, optimizer=optimizer, state=TrainerState(step=1),
                        tokenizer=ByteTokenizer(), ctx=ParallelLayout(), keep_last=1, sharded=True)
    return found


def _consolidate_clashes(w: Workspace, scratch: Path) -> list[Clash]:
    held = scratch / "step-0000001"
    shutil.copytree(_sharded_checkpoint(w), held)
    return [_file_clash(held / name, lambda out: ["checkpoint", "consolidate", str(held), "--out", out, "--force"])
            for name in ("shard-rank00000.safetensors", "sharded.json")]


WRITERS: dict[str, tuple[Writer, ...]] = {
    "schema": (Writer("-o", lambda w, out: ["schema", "-o", str(out)], suffix=".json"),),
    "new-plugin": (Writer("--dir", lambda w, out: ["new-plugin", "mine", "--dir", str(out.parent)], folder=True,
                          suffix="/specformer-mine"),),
    "inspect": (Writer("--out", lambda w, out: ["inspect", str(w.float_ckpt), "--prompt", "ab", "--out", str(out)],
                       folder=True, suffix="", clashes=_inspect_clashes),),
    "merge": (Writer("-o", lambda w, out: ["merge", str(w.adapter), "-o", str(out)], clashes=_merge_clashes),),
    "quantize": (Writer("-o", lambda w, out: ["quantize", str(w.float_ckpt), "--method", "int8", "-o", str(out)],
                        clashes=_quantize_clashes),),
    "hf import": (
        Writer("output", lambda w, out: ["hf", "import", str(w.hf_dir), str(out)], clashes=_import_clashes),
        Writer("--spec-out", lambda w, out: ["hf", "import", str(w.hf_dir), str(out.with_suffix(".safetensors")),
                                             "--spec-out", str(out)], suffix=".yaml"),
    ),
    "peft import": (
        Writer("output", lambda w, out: ["peft", "import", str(w.peft_dir), str(out), "--base", str(w.base)],
               clashes=_peft_import_clashes),
    ),
    "hf export": (
        Writer("directory", lambda w, out: ["hf", "export", str(w.float_ckpt), str(out)], folder=True, suffix="",
               clashes=_export_clashes),
    ),
    "peft export": (
        Writer("directory", lambda w, out: ["peft", "export", str(w.adapter), str(out)], folder=True, suffix=""),
    ),
    "hf attach-tokenizer": (Writer("checkpoint", lambda w, out: ["hf", "attach-tokenizer", str(out), str(w.tokenizer)],
                                   ready=lambda w, out: _copy(w.base, out), existing=_checkpoint_with_a_tokenizer,
                                   clashes=_attach_clashes),),
    "checkpoint consolidate": (Writer("--out", lambda w, out: ["checkpoint", "consolidate", str(_sharded_checkpoint(w)),
                                                               "--out", str(out)], clashes=_consolidate_clashes),),
    "export gguf": (Writer("output", lambda w, out: ["export", "gguf", str(w.float_ckpt), str(out)], suffix=".gguf"),),
    "train": (Writer("--out", lambda w, out: _train(w, str(out)), folder=True, suffix="", force="--overwrite",
                     existing=_earlier_run, clashes=_train_clashes),),
}

#: Commands that write no file, and why that is so.
WRITES_NOTHING: dict[str, str] = {
    "validate": "prints whether each spec is valid",
    "summary": "prints a table or JSON",
    "components": "prints the registry",
    "plugins": "prints the loaded plugins",
    "eval": "prints its measurements (a table or --json) on stdout; no option names a file to write",
    "generate": "prints the continuation",
    "chat": "talks on stdin and stdout",
    "serve": "answers over HTTP",
    "hf families": "prints the families",
}

CASES = [pytest.param(name, i, id=f"{name}-{i}") for name, writers in WRITERS.items() for i in range(len(writers))]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(found[0].choices) if found else {}


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every command and sub-command (``hf import``) the CLI has, with its parser."""
    parser, commands = make_parser()
    found = {}
    for name, sub in _subparsers(parser).items():
        nested = _subparsers(sub)
        found.update({f"{name} {action}": p for action, p in nested.items()} if nested else {name: sub})
    assert {name.split()[0] for name in found} == set(commands.by_name)
    return found


def test_every_command_is_classified_as_writing_files_or_not():
    commands = _commands()
    unclassified = sorted(set(commands) - set(WRITERS) - set(WRITES_NOTHING))
    assert not unclassified, (
        f"command(s) {unclassified} are in neither WRITERS nor WRITES_NOTHING of {__file__}: classify each. A command "
        "that writes a file must check it with specformer.files.outputs (refused if it exists, unless --force; never one of "
        "its inputs; written atomically) and be listed in WRITERS with its cases; one that writes none goes in "
        "WRITES_NOTHING with why")
    assert not (set(WRITERS) | set(WRITES_NOTHING)) - set(commands), "the table names commands that no longer exist"
    assert not set(WRITERS) & set(WRITES_NOTHING)
    for name, writers in WRITERS.items():
        actions = commands[name]._actions
        for writer in writers:
            assert any(writer.output in a.option_strings or writer.output == a.dest for a in actions), (name, writer.output)
            assert any(writer.force in a.option_strings for a in actions), f"{name} has no {writer.force}"


def _writer(name: str, index: int) -> Writer:
    return WRITERS[name][index]


def _snapshot(path: Path) -> dict[str, bytes]:
    if path.is_file():
        return {"": path.read_bytes()}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def _run(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


@pytest.mark.parametrize("name, index", CASES)
def test_an_existing_output_is_replaced_only_when_asked(w, tmp_path, capsys, name, index):
    writer = _writer(name, index)
    out = Path(f"{tmp_path / 'out'}{writer.suffix}")
    if writer.existing is not None:
        writer.existing(w, out)
    elif writer.folder:
        out.mkdir(parents=True)
        (out / "keep.txt").write_bytes(b"someone's work")
    else:
        out.write_bytes(b"someone's work")
    before = _snapshot(out)
    code, err = _run(writer.write(w, out), capsys)
    assert code == 2 and writer.force in err, err
    assert _snapshot(out) == before


def _spellings(target: Path, links: Path, monkeypatch, *, hard_link: bool) -> dict[str, str]:
    links.mkdir(parents=True)
    names = {"same path": str(target), "./ relative": f"./{target.name}",
             "a/../a": f"{target.parent}/../{target.parent.name}/./{target.name}",
             "symlink": str(links / f"link-{target.name}")}
    (links / f"link-{target.name}").symlink_to(target)
    if target.is_file() and hard_link:
        names["hard link"] = str(links / f"hard-{target.name}")
        os.link(target, links / f"hard-{target.name}")
    monkeypatch.chdir(target.parent)
    return names


#: Writers that read files (schema and new-plugin read none: nothing of theirs can be overwritten).
CLASH_CASES = [c for c in CASES if _writer(*c.values).clashes is not _no_clashes]


@pytest.mark.parametrize("name, index", CLASH_CASES)
def test_an_input_is_never_the_output_even_with_force(w, tmp_path, capsys, monkeypatch, name, index):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for i, clash in enumerate(_writer(name, index).clashes(w, scratch)):
        spellings = _spellings(clash.target, tmp_path / f"links-{i}", monkeypatch, hard_link=clash.hard_link)
        for spelling, given in spellings.items():
            before = _snapshot(clash.target)
            code, err = _run(clash.argv(given), capsys)
            assert code == 2, (clash.argv(given), spelling, err)
            # A symbolic link named as a folder to replace is refused as such before the inputs are all known.
            assert "an input of this command" in err or (spelling == "symlink" and "is a symbolic link" in err), err
            assert _snapshot(clash.target) == before and clash.protected.exists(), (clash.argv(given), spelling)


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
@pytest.mark.parametrize("name, index", CASES)
def test_a_write_leaves_no_temporaries_and_follows_the_umask(w, tmp_path, capsys, name, index, umask):
    writer = _writer(name, index)
    work = tmp_path / "work"
    previous = os.umask(umask)
    try:
        work.mkdir()
        out = Path(f"{work / 'out'}{writer.suffix}")
        if writer.ready is not None:
            writer.ready(w, out)
        code, err = _run(writer.write(w, out), capsys)
    finally:
        os.umask(previous)
    assert code == 0, err
    assert out.is_dir() if writer.folder else out.is_file()
    written = sorted(work.rglob("*"))
    assert not [p for p in written if p.name.startswith(".")], "a temporary was left behind"
    for path in written:
        expected = (0o777 if path.is_dir() else 0o666) & ~umask
        assert stat.S_IMODE(path.lstat().st_mode) == expected, (str(path.relative_to(work)), oct(path.lstat().st_mode))


def test_training_never_deletes_data_that_lies_in_its_run_directory(w, tmp_path, capsys):
    run = tmp_path / "run"
    _earlier_run(w, run)
    corpus = _copy(w.corpus, run / "notes.txt")
    code, err = _run(["train", str(w.spec), "--data", str(corpus), "--out", str(run), *TRAIN, "--overwrite"], capsys)
    assert code == 0, err
    assert corpus.read_bytes() == w.corpus.read_bytes()
    assert (run / "model.safetensors").read_bytes() != b"an earlier run's model"  # the earlier run was replaced


def test_merge_and_export_name_the_input_they_refuse(w, tmp_path, capsys):
    scratch = tmp_path / "s"
    scratch.mkdir()
    base = _copy(w.base, scratch / "base.safetensors")
    adapter = make_adapter(base, scratch / "adapter.safetensors")
    code, err = _run(["merge", str(adapter), "-o", str(base), "--force"], capsys)
    assert code == 2 and f"{base}: is also an input of this command; write to another path" in err
    code, err = _run(["peft", "export", str(adapter), str(scratch), "--force"], capsys)
    assert code == 2 and f"{scratch}: holds {adapter}, an input of this command" in err
    assert json.loads(specformer.checkpoint.save_load.read_metadata(adapter)["adapter"])["base"]["path"] == str(base.resolve())
