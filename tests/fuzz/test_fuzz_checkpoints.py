"""Property-based: any checkpoint file loads, or is refused with one clear error before allocating.

A case starts from a real checkpoint of the tiny model and forges it with safetensors
directly (``save_file`` with any metadata and any tensors), or writes the file's bytes
by hand for what safetensors itself would never write:

- header entries: ``format`` missing or another tool's; ``spec`` missing, invalid JSON,
  a JSON list/number/string/null, nested thousands deep, the tiny spec changed at a few
  paths (the strategies of ``tests/core/spec/test_bad_specs.py``) or claiming a far larger
  model than the tensors hold; ``component_sources`` and ``tokenizer`` entries of any
  form (unknown kinds, a BPE entry with no or garbage data); extra entries;
- tensors: dropped, renamed, extra, another dtype (integer, bool, half, double), another
  shape (including empty ones);
- raw bytes: a header length larger than the file, a header that is not JSON or not an
  object, data offsets outside the file, unknown dtypes, shapes whose product overflows.

Invariant (``harness``): ``specformer.load`` and ``check_checkpoint`` return or raise a
user error; ``specformer summary CKPT`` and ``specformer generate CKPT`` exit 0 or 2
without a traceback (and ``summary`` succeeds exactly when ``load`` does); under the
64 MiB memory guard, within the time and memory bounds, nothing outside the case changed.
"""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import event, example, given
from hypothesis import strategies as st
from safetensors.torch import save_file

import specformer
from specformer.checkpoint.save_load import read_metadata, read_tensors
from specformer.checkpoint.check import check_checkpoint
from specformer.errors import MemoryLimitError

from conftest import TINY
from fuzz.harness import FAST, PREFIX, SLOW, case_dir, expect_user_error, load_sibling_tests, outcome, run_cli, sentinel

bad_specs = load_sibling_tests("core/spec/test_bad_specs.py", "_fuzz_bad_specs")

_model = specformer.build(TINY, seed=0)
TENSORS = {name: t.detach().clone().contiguous() for name, t in _model.state_dict().items()}
del _model

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=10)


@st.composite
def spec_texts(draw: Any) -> str:
    """The header's ``spec`` entry: the tiny spec changed, or something that is not a spec at all."""
    form = draw(st.integers(0, 9))
    if form <= 4:
        spec = copy.deepcopy(TINY)
        for path, value in draw(st.lists(st.tuples(st.sampled_from(bad_specs.PATHS), bad_specs.values), max_size=2)):
            spec = bad_specs.mutate(spec, path, value)
        return json.dumps(spec)
    if form == 5:  # claims a larger model than the tensors hold
        spec = copy.deepcopy(TINY)
        key = draw(st.sampled_from(["n_layers", "d_model", "vocab_size", "context_length"]))
        spec["model"][key] = draw(st.sampled_from([3, 64, 10**4, 10**6, 10**9, 2**40, 2**62, 2**64]))
        return json.dumps(spec)
    if form == 6:
        return json.dumps(draw(json_values))
    if form == 7:
        depth = draw(st.sampled_from([65, 1000, 100_000]))
        return "[" * depth + "]" * depth
    if form == 8:
        return json.dumps(draw(st.sampled_from(["specs/tiny.yaml", "/etc/passwd", "tiny.yaml", ""])))
    return draw(st.text(max_size=30))


@st.composite
def tokenizer_texts(draw: Any) -> str:
    kind = draw(st.one_of(st.sampled_from(["byte", "bpe", "none"]), json_scalars))
    data: Any = {"kind": kind}
    for key in draw(st.lists(st.sampled_from(["tokenizer", "eot_token", "vocab_size", "eot_id"]), max_size=3, unique=True)):
        data[key] = draw(st.one_of(json_values, st.sampled_from([{"model": {"type": "BPE"}}, {"version": "1.0"}, 97, 256])))
    if draw(st.integers(0, 4)) == 4:
        data = draw(json_values)
    return json.dumps(data) if draw(st.integers(0, 5)) < 5 else draw(st.text(max_size=20))


@st.composite
def headers(draw: Any) -> dict[str, str]:
    metadata = {"format": "specformer-checkpoint/1", "spec": json.dumps(TINY)}
    edits = draw(st.lists(st.sampled_from(["format", "spec", "component_sources", "tokenizer", "other", "drop"]),
                          max_size=3, unique=True))
    for edit in edits:
        if edit == "format":
            metadata["format"] = draw(st.sampled_from(["pt", "specformer-checkpoint/2", "", "specformer-checkpoint/1 "]))
        elif edit == "spec":
            metadata["spec"] = draw(spec_texts())
        elif edit == "component_sources":
            metadata["component_sources"] = json.dumps(draw(json_values))
        elif edit == "tokenizer":
            metadata["tokenizer"] = draw(tokenizer_texts())
        elif edit == "other":
            metadata[draw(st.text(min_size=1, max_size=10))] = draw(st.text(max_size=20))
        else:
            metadata.pop(draw(st.sampled_from(["format", "spec"])))
    return metadata


@st.composite
def tensor_edits(draw: Any) -> list[tuple[str, str, Any]]:
    """Changes to the real tensors as (name, change, argument): small to print when a case fails."""
    edits = []
    for name in draw(st.lists(st.sampled_from(sorted(TENSORS)), max_size=3, unique=True)):
        change = draw(st.sampled_from(["drop", "dtype", "shape", "rename"]))
        argument = draw({
            "drop": st.none(),
            "dtype": st.sampled_from(["int64", "int32", "uint8", "bool", "float16", "bfloat16", "float64", "int8"]),
            "shape": st.lists(st.integers(0, 40), max_size=3),
            "rename": st.text(min_size=1, max_size=20),
        }[change])
        edits.append((name, change, argument))
    if draw(st.integers(0, 5)) == 5:
        edits.append((draw(st.text(min_size=1, max_size=20)), "extra", draw(st.lists(st.integers(0, 8), max_size=3))))
    return edits


def edited(edits: list[tuple[str, str, Any]]) -> dict[str, torch.Tensor]:
    tensors = dict(TENSORS)
    for name, change, argument in edits:
        if change == "drop":
            del tensors[name]
        elif change == "dtype":
            tensors[name] = tensors[name].to(getattr(torch, argument))
        elif change in ("shape", "extra"):
            tensors[name] = torch.zeros(argument)
        else:
            tensors[argument] = tensors.pop(name)
    return tensors


def raw_file(header: Any, data: bytes, *, length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


@st.composite
def raw_files(draw: Any) -> bytes:
    """Bytes safetensors' writer would never produce: forged lengths, offsets, dtypes, shapes."""
    entry = {"dtype": draw(st.sampled_from(["F32", "I64", "BOOL", "F8_E4M3", "XYZ", "", "F32 "])),
             "shape": draw(st.lists(st.one_of(st.integers(0, 40), st.integers(-5, 2**64)), max_size=4)),
             "data_offsets": draw(st.lists(st.integers(-5, 2**64), min_size=0, max_size=3))}
    header: Any = {"__metadata__": {"format": "specformer-checkpoint/1", "spec": json.dumps(TINY)},
                   draw(st.sampled_from(sorted(TENSORS))): entry}
    form = draw(st.integers(0, 5))
    if form == 0:
        header = draw(json_values)
    elif form == 1:
        header["__metadata__"] = draw(json_values)
    data = draw(st.binary(max_size=64))
    if form == 2:
        return raw_file(header, data, length=draw(st.sampled_from([0, 1, 7, 2**31, 2**63, 2**64 - 1])))
    if form == 3:
        return draw(st.binary(max_size=40))
    return raw_file(header, data)


@st.composite
def checkpoints(draw: Any) -> tuple[str, Any]:
    if draw(st.integers(0, 5)) == 5:  # hypothesis draws small numbers most: forged files are the usual case
        return "raw", draw(raw_files())
    return "forged", (draw(headers()), draw(tensor_edits()))


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    return sentinel(tmp_path_factory, "checkpoints")


def _case(outside: Path, checkpoint: tuple[str, Any]) -> None:
    form, content = checkpoint
    with case_dir(outside) as case:
        path = case.work / f"{PREFIX}ckpt.safetensors"
        if form == "raw":
            path.write_bytes(content)
        else:
            metadata, edits = content
            save_file(edited(edits), str(path), metadata=metadata)
        checked = expect_user_error(lambda: check_checkpoint(path))
        loaded = expect_user_error(lambda: specformer.load(path), allowed=(MemoryLimitError,))
        summary = run_cli(["summary", str(path)])
        valid = isinstance(loaded, torch.nn.Module)
        event(f"{form} file, load: {outcome(loaded)}")
        if valid:
            assert not isinstance(checked, Exception) and summary.code == 0, summary.err
        event(f"generate: exit {run_cli(['generate', str(path), '--prompt', 'AB', '--max-new-tokens', '2']).code}")


def _tiny_checkpoint_with(**header: str) -> tuple[str, Any]:
    return "forged", ({"format": "specformer-checkpoint/1", "spec": json.dumps(TINY), **header}, [])


@FAST
@given(checkpoint=checkpoints())
@example(checkpoint=_tiny_checkpoint_with())  # the valid one: loads, summarises and generates
@example(checkpoint=_tiny_checkpoint_with(spec='"specs/tiny.yaml"'))  # a string is never a path
@example(checkpoint=_tiny_checkpoint_with(spec=json.dumps({"model": {**TINY["model"], "n_layers": 10**6}})))
@example(checkpoint=_tiny_checkpoint_with(spec=json.dumps({"model": {**TINY["model"], "vocab_size": 2**64}})))  # found by fuzzing
@example(checkpoint=_tiny_checkpoint_with(tokenizer='{"kind": "bpe"}'))  # a BPE entry with no data
@example(checkpoint=_tiny_checkpoint_with(tokenizer='{"kind": "bpe", "tokenizer": {"model": 3}}'))  # garbage data
@example(checkpoint=_tiny_checkpoint_with(tokenizer="[" * 100_000 + "]" * 100_000))  # RecursionError in json.loads
@example(checkpoint=("raw", raw_file({"embedding.weight": {"dtype": "F32", "shape": [2**40, 2**40], "data_offsets": [0, 4]}}, b"\0" * 4)))
def test_any_checkpoint(outside, checkpoint):
    _case(outside, checkpoint)


@pytest.mark.slow
@SLOW
@given(checkpoint=checkpoints())
def test_any_checkpoint_many(outside, checkpoint):
    _case(outside, checkpoint)
