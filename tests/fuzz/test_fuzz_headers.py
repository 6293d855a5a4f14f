"""Property-based: an adapter or quantized checkpoint with any header entry loads, or is one clear one-line error.

A case starts from a real tiny checkpoint of one of three kinds, made once per module:
a LoRA adapter checkpoint (its ``adapter`` entry: the component, the wrapped layers and
the base's path and hash) over a float base, and an int8 and an int4 quantized checkpoint
(their ``quantization`` recipe: the scheme, the quantized layers, the head's scheme). It
parses that entry's JSON and changes it one to three times, each at a path drawn from
what the entry holds then:

- a value replaced by one an entry holds elsewhere (a rank, a scheme, a layer glob; often valid);
- a value replaced by one of another type (``null``, booleans, text, lists, mappings);
- a number made huge, negative, zero, fractional, infinite or NaN;
- a key dropped, or a key added (made-up, or one a sibling component accepts);
- a string cut short (a layer name, a scheme's ``kind``, the base's path or hash);
- a value buried under 2 to 100,000 levels of lists;

or, one case in ten, cuts the entry's JSON text itself short. The base is copied beside
the case's file (so its recorded relative path finds it) and the tensors are the
original ones.

Invariant (``harness``): ``check_checkpoint`` and ``specformer.load`` return or raise a
user error whose message is one line, without pydantic's documentation link; one of
``specformer generate``, ``summary``, ``eval`` and (for the adapter) ``merge`` exits 0,
or 2 with exactly one ``error:`` line and no traceback; within the time and memory
bounds, nothing outside the case changed.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import event, example, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

import specformer
from specformer.checkpoint.check import check_checkpoint
from specformer.errors import MemoryLimitError
from specformer.tokenizers.tokenizer import METADATA_KEY, ByteTokenizer
from specformer_finetune.adapter_file import base_reference, save_adapter
from specformer_finetune.apply import apply_adapter
from specformer_quant import quantize
from specformer_quant.apply import RECIPE_KEY, recipe_json

from fuzz.harness import FAST, PREFIX, SLOW, case_dir, expect_user_error, outcome, run_cli, sentinel
from fixtures.tiny import tiny_spec

MODEL = tiny_spec(vocab_size=259, block={"mixer": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1},
                                         "ffn": {"kind": "swiglu", "hidden": 64}})
LORA = {"kind": "lora", "rank": 4, "alpha": 8, "dropout": 0.0, "targets": ["blocks.*.mixer.qkv", "blocks.*.ffn.down"]}
#: The kind of checkpoint, its file in the sentinel folder, and the header entry the case changes.
KINDS = {"adapter": (f"{PREFIX}adapter.safetensors", "adapter"), "int8": (f"{PREFIX}int8.safetensors", RECIPE_KEY),
         "int4": (f"{PREFIX}int4.safetensors", RECIPE_KEY)}
BASE = f"{PREFIX}base.safetensors"
NOTES = f"{PREFIX}notes.txt"

FAST_HEADERS = settings(FAST, max_examples=30)

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)
NUMBERS = [0, -1, 1, 2, 7, 48, 4097, 2**31, 2**63, 2**64, 10**100, -(2**63), 0.5, -0.5, 1e308, 1e-308,
           math.inf, -math.inf, math.nan]
#: Values an entry holds somewhere (several of them valid where they land): cases that still load.
PLAUSIBLE = [1, 2, 4, 8, 16.0, 0.1, True, False, "kaiming", "gaussian", "int8", "int4", "bf16", 32, 64, 128,
             "blocks.*.ffn.*", ["blocks.0.mixer.qkv"], {"kind": "int8"}, None]
#: Keys a sibling component or another checkpoint's entry accepts: a mix-up more likely than a made-up name.
KNOWN_KEYS = ["kind", "rank", "alpha", "dropout", "init", "targets", "base", "group_size", "dynamic_activations",
              "scheme", "linears", "stacks", "tied_head", "lm_head_scheme", "adapter", "path", "sha256", "relative"]


def paths_of(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into ``value`` (the root included), mapping keys and list indices alike."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths_of(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += paths_of(item, (*prefix, i))
    return found


def at(value: Any, path: tuple) -> Any:
    for part in path:
        value = value[part]
    return value


def replaced(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    parent = at(value, path[:-1])
    parent[path[-1]] = new
    return value


@st.composite
def entry_edits(draw: Any, entry: Any) -> Any:
    """``entry`` (parsed JSON) changed one to three times, each at a path drawn from what it holds by then."""
    entry = copy.deepcopy(entry)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(paths_of(entry)))
        current = at(entry, path)
        change = draw(st.sampled_from(["plausible", "type", "number", "drop", "add", "truncate", "nest"]))
        if change == "plausible":
            # a copy: the case edits what it inserted, and PLAUSIBLE must stay the same for every case
            entry = replaced(entry, path, copy.deepcopy(draw(st.sampled_from(PLAUSIBLE))))
        elif change == "type":
            entry = replaced(entry, path, draw(json_values))
        elif change == "number":
            entry = replaced(entry, path, draw(st.sampled_from(NUMBERS)))
        elif change == "drop" and path:
            parent = at(entry, path[:-1])
            del parent[path[-1]]
        elif change == "add" and isinstance(current, (dict, list)):
            new = draw(json_values)
            if isinstance(current, dict):
                current[draw(st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=8)))] = new
            else:
                current.append(new)
        elif change == "truncate" and isinstance(current, str):
            entry = replaced(entry, path, current[: draw(st.integers(0, max(0, len(current) - 1)))])
        elif change == "nest":
            depth = draw(st.sampled_from([2, 10, 65, 1000, 100_000]))
            entry = replaced(entry, path, _nested(current, depth) if depth < 500 else None)
            if depth >= 500:  # deeper than json.dumps recurses: written as text below
                return ("deep", path, depth, entry)
        else:
            entry = replaced(entry, path, draw(json_values))
    return entry


def _nested(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def entry_text(edited: Any) -> str:
    """The header entry's text: nesting deeper than ``json.dumps`` recurses is spliced in as text."""
    if isinstance(edited, tuple) and edited and edited[0] == "deep":
        _, path, depth, entry = edited
        marker = "\u2063fz-deep\u2063"
        text = json.dumps(replaced(entry, path, marker))
        return text.replace(json.dumps(marker), "[" * depth + "1" + "]" * depth, 1)
    return json.dumps(edited)


@st.composite
def cases(draw: Any) -> tuple[str, str, str]:
    """(kind, the changed entry's text, the command tried)."""
    kind = draw(st.sampled_from(sorted(KINDS)))
    original = json.loads(ORIGINAL_ENTRIES[kind])
    if draw(st.integers(0, 9)) == 9:
        text = ORIGINAL_ENTRIES[kind]
        text = text[: draw(st.integers(0, len(text) - 1))]
    else:
        text = entry_text(draw(entry_edits(original)))
    commands = (["merge"] if kind == "adapter" else []) + ["generate", "summary", "eval"]
    return kind, text, draw(st.sampled_from(commands))


def _build(folder: Path) -> None:
    """The base, the adapter over it and the two quantized checkpoints, written into ``folder``."""
    base = folder / BASE
    specformer.save(specformer.build(MODEL, seed=0), base, metadata={METADATA_KEY: ByteTokenizer().to_json()})
    model = specformer.load(base)
    apply_adapter(model, LORA).base = base_reference(base)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    save_adapter(model, folder / KINDS["adapter"][0])
    for scheme in ("int8", "int4"):
        quantized = specformer.load(base)
        recipe = quantize(quantized, scheme, quantize_lm_head=scheme == "int8",
                          lm_head_scheme="int4" if scheme == "int8" else None)
        specformer.save(quantized, folder / KINDS[scheme][0],
                        metadata={METADATA_KEY: ByteTokenizer().to_json(), RECIPE_KEY: recipe_json(recipe)})
    (folder / NOTES).write_text("the model reads tokens and predicts the next one\n" * 20)


def _made_at_import() -> tuple[dict[str, bytes], dict[str, str]]:
    """The files' bytes and the entries the strategies start from (``@example`` needs them before any fixture)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix=PREFIX) as tmp:
        folder = Path(tmp)
        _build(folder)
        files = {p.name: p.read_bytes() for p in folder.iterdir()}
        entries = {}
        for kind, (name, key) in KINDS.items():
            with safe_open(str(folder / name), framework="pt") as f:
                entries[kind] = f.metadata()[key]
    # The base is recorded by path and hash; every case gets a copy of it beside its file, found by the relative path.
    record = json.loads(entries["adapter"])
    record["base"] = {**record["base"], "path": f"/nonexistent/{BASE}", "relative": BASE}
    entries["adapter"] = json.dumps(record, sort_keys=True)
    return files, entries


FILES, ORIGINAL_ENTRIES = _made_at_import()


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    folder = sentinel(tmp_path_factory, "headers")
    for name, data in FILES.items():
        (folder / name).write_bytes(data)
    return folder


def _case(outside: Path, case_input: tuple[str, str, str]) -> None:
    kind, text, command = case_input
    name, key = KINDS[kind]
    with case_dir(outside) as case:
        shutil.copy2(outside / BASE, case.work / BASE)
        with safe_open(str(outside / name), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys()}
            metadata = dict(f.metadata())
        metadata[key] = text
        path = case.work / f"{PREFIX}case.safetensors"
        save_file(tensors, str(path), metadata=metadata)
        checked = expect_user_error(lambda: check_checkpoint(path))
        loaded = expect_user_error(lambda: specformer.load(path), allowed=(MemoryLimitError,))
        for result in (checked, loaded):
            if isinstance(result, BaseException):
                message = str(result)
                assert "\n" not in message.strip(), f"a message of more than one line:\n{message}"
                assert "errors.pydantic.dev" not in message, message
        event(f"{kind}, load: {outcome(loaded)}")
        argv = {"generate": ["generate", str(path), "--prompt", "ab", "--max-new-tokens", "2"],
                "summary": ["summary", str(path)],
                "eval": ["eval", str(path), "--data", str(case.work / NOTES)],
                "merge": ["merge", str(path), "-o", str(case.work / f"{PREFIX}merged.safetensors")]}[command]
        if command == "eval":
            shutil.copy2(outside / NOTES, case.work / NOTES)
        result = run_cli(argv)
        if result.code == 2:
            errors = [line for line in result.err.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and len(result.err.strip().splitlines()) == 1, result.err
            assert "errors.pydantic.dev" not in result.err, result.err
        if isinstance(loaded, torch.nn.Module) and command != "merge":
            assert result.code == 0, f"{command} refused what load read:\n{result.err}"
        event(f"{kind}, {command}: exit {result.code}")


def _with(kind: str, change: Any) -> tuple[str, str, str]:
    entry = json.loads(ORIGINAL_ENTRIES[kind])
    change(entry)
    return kind, json.dumps(entry), "generate"


@FAST_HEADERS
@given(case_input=cases())
@example(case_input=_with("adapter", lambda e: None))  # the original: loads and generates
@example(case_input=_with("int4", lambda e: None))
@example(case_input=_with("adapter", lambda e: e["adapter"].update(rank=1_000_000_000)))  # pydantic's text, before
@example(case_input=_with("int4", lambda e: e["scheme"].update(group_size=7)))
@example(case_input=_with("int8", lambda e: e.update(lm_head_scheme={"kind": "int8", "dynamic_activations": "x"})))
@example(case_input=_with("adapter", lambda e: e["targets"].__setitem__(0, 1)))  # TypeError (found by fuzzing)
def test_any_adapter_or_quantized_header(outside, case_input):
    _case(outside, case_input)


@pytest.mark.slow
@SLOW
@given(case_input=cases())
def test_any_adapter_or_quantized_header_many(outside, case_input):
    _case(outside, case_input)
