"""Checkpoints: bit-exact round trips through one safetensors file; clear errors for bad files."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import specformer
from specformer.checkpoint.save_load import read_metadata
from specformer.errors import CheckpointError


@pytest.fixture
def saved(tmp_path, tiny_spec):
    model = specformer.build(tiny_spec, seed=0)
    path = specformer.save(model, tmp_path / "tiny.safetensors")
    return model, path


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(tmp_path, tiny_spec, dtype):
    tiny_spec["model"].update(tie_embeddings=False, lm_head_bias=True)
    model = specformer.build(tiny_spec, seed=0, dtype=dtype)
    path = specformer.save(model, tmp_path / "m.safetensors")
    loaded = specformer.load(path)
    assert loaded.spec.to_dict() == model.spec.to_dict()
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert a.dtype == b.dtype == dtype, name
        assert torch.equal(a, b), name
    x = torch.randint(0, 97, (2, 7))
    assert torch.equal(model(x), loaded(x))


def test_file_is_plain_safetensors_with_the_spec_in_the_header(saved):
    model, path = saved
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        names = set(f.keys())
    assert names == set(model.state_dict())
    assert json.loads(meta["spec"]) == model.spec.to_dict()
    assert not path.read_bytes().startswith(b"\x80")  # not a pickle stream


def test_save_is_atomic_and_leaves_no_temporary_file(saved):
    _, path = saved
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        specformer.load(tmp_path / "nope.safetensors")


def test_truncated_file(saved):
    _, path = saved
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="not a readable safetensors checkpoint|cannot read tensors"):
        specformer.load(path)


def test_garbage_file(tmp_path):
    path = tmp_path / "junk.safetensors"
    path.write_bytes(b"\x00\x01 definitely not a checkpoint" * 10)
    with pytest.raises(CheckpointError, match="not a readable safetensors checkpoint"):
        specformer.load(path)


def test_safetensors_without_a_spec(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))
    with pytest.raises(CheckpointError, match="not a specformer checkpoint"):
        specformer.load(path)


def rewrite(path, *, tensors=None, spec=None):
    meta = read_metadata(path)
    with safe_open(str(path), framework="pt") as f:
        current = {k: f.get_tensor(k) for k in f.keys()}
    if spec is not None:
        meta["spec"] = spec
    save_file(tensors(current) if tensors else current, str(path), metadata=meta)


def test_missing_extra_and_misshaped_tensors_are_named(saved):
    _, path = saved

    def damage(t):
        t.pop("blocks.0.attention.qkv.weight")
        t["blocks.9.surprise"] = torch.zeros(1)
        t["final_norm.weight"] = torch.ones(5)
        return t

    rewrite(path, tensors=damage)
    with pytest.raises(CheckpointError) as info:
        specformer.load(path)
    msg = str(info.value)
    assert "missing tensors: blocks.0.attention.qkv.weight" in msg
    assert "unexpected tensors: blocks.9.surprise" in msg
    assert "final_norm.weight (checkpoint (5,), model (32,))" in msg


def test_spec_that_no_longer_validates(saved):
    _, path = saved
    spec = json.loads(read_metadata(path)["spec"])
    spec["model"]["block"]["norm"] = {"kind": "fancynorm"}
    rewrite(path, spec=json.dumps(spec))
    with pytest.raises(CheckpointError, match="unknown norm 'fancynorm'"):
        specformer.load(path)


def test_spec_that_is_not_json(saved):
    _, path = saved
    rewrite(path, spec="{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        specformer.load(path)


def test_wrong_spec_for_the_weights(saved, tiny_spec):
    _, path = saved
    tiny_spec["model"]["d_model"] = 64
    rewrite(path, spec=json.dumps(tiny_spec))
    with pytest.raises(CheckpointError, match="mis-shaped tensors"):
        specformer.load(path)


def test_extra_metadata_is_kept(tmp_path, tiny_spec):
    model = specformer.build(tiny_spec)
    path = specformer.save(model, tmp_path / "m.safetensors", metadata={"step": "12"})
    assert read_metadata(path)["step"] == "12"
