"""Checkpoints: bit-exact round trips through one safetensors file, what the header holds, the layout
check, which messages name which problem, the bytes the memory check is asked for, and the dtype a
loaded model keeps."""

from __future__ import annotations

import copy
import json

import pytest
from safetensors import safe_open
from safetensors.torch import save_file
import torch

import specformer
import specformer.files.atomic as atomic
from specformer.checkpoint.save_load import FORMAT, load_weights, read_metadata, read_tensors
import specformer.checkpoint.save_load as checkpoint
from specformer.checkpoint.check import (CheckedCheckpoint, TensorInfo, _few, _json_type, check_checkpoint,
                                         compare_layout, expected_tensors, spec_data, tensor_infos)
from specformer.errors import CheckpointError
from specformer.registry.hookspecs import hookimpl
from specformer.registry.discovery import get_plugin_manager
from specformer.version import __version__

from conftest import TINY


@pytest.fixture
def model() -> torch.nn.Module:
    return specformer.build(TINY, seed=0)


@pytest.fixture
def saved(tmp_path, model):
    return specformer.save(model, tmp_path / "new" / "deeper" / "tiny.safetensors")


def weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_is_bit_exact(tmp_path, fresh_tiny_spec, dtype):
    fresh_tiny_spec["model"].update(tie_embeddings=False, lm_head_bias=True)
    model = specformer.build(fresh_tiny_spec, seed=0, dtype=dtype)
    path = specformer.save(model, tmp_path / "m.safetensors")
    loaded = specformer.load(path)
    assert loaded.spec.to_dict() == model.spec.to_dict()
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert a.dtype == b.dtype == dtype, name
        assert torch.equal(a, b), name
    x = torch.randint(0, 97, (2, 7))
    assert torch.equal(model(x), loaded(x))


def test_file_is_plain_safetensors_with_the_spec_in_the_header(model, saved):
    path = saved
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        names = set(f.keys())
    assert names == set(model.state_dict())
    assert json.loads(meta["spec"]) == model.spec.to_dict()
    assert not path.read_bytes().startswith(b"\x80")  # not a pickle stream


def test_missing_file(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        specformer.load(tmp_path / "nope.safetensors")


def test_truncated_file(saved):
    path = saved
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
    path = saved

    def damage(t):
        t.pop("blocks.0.mixer.qkv.weight")
        t["blocks.9.surprise"] = torch.zeros(1)
        t["final_norm.weight"] = torch.ones(5)
        return t

    rewrite(path, tensors=damage)
    with pytest.raises(CheckpointError) as info:
        specformer.load(path)
    msg = str(info.value)
    assert "missing tensors: blocks.0.mixer.qkv.weight" in msg
    assert "unexpected tensors: blocks.9.surprise" in msg
    assert "final_norm.weight (checkpoint (5,), model (32,))" in msg


def test_spec_that_no_longer_validates(saved):
    path = saved
    spec = json.loads(read_metadata(path)["spec"])
    spec["model"]["block"]["norm"] = {"kind": "fancynorm"}
    rewrite(path, spec=json.dumps(spec))
    with pytest.raises(CheckpointError, match="unknown norm 'fancynorm'"):
        specformer.load(path)


def test_spec_that_is_not_json(saved):
    path = saved
    rewrite(path, spec="{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        specformer.load(path)


def test_wrong_spec_for_the_weights(saved, fresh_tiny_spec):
    path = saved
    fresh_tiny_spec["model"]["d_model"] = 64
    rewrite(path, spec=json.dumps(fresh_tiny_spec))
    with pytest.raises(CheckpointError, match="mis-shaped tensors"):
        specformer.load(path)


# -- checkpoint.py -----------------------------------------------------------------------


def test_save_writes_the_header_and_the_weights_into_a_new_folder(tmp_path, model, saved):
    assert saved == tmp_path / "new" / "deeper" / "tiny.safetensors"  # both folders made
    header = read_metadata(saved)
    assert header["format"] == FORMAT == "specformer-checkpoint/1"
    assert json.loads(header["spec"]) == json.loads(model.spec.to_json())
    assert header["specformer_version"] == __version__
    assert "component_sources" in header  # which plugin provided each component
    tensors = read_tensors(saved)
    assert tensors.keys() == model.state_dict().keys()
    for name, t in model.state_dict().items():
        assert torch.equal(tensors[name], t), name
    tagged = specformer.save(model, tmp_path / "tagged.safetensors", metadata={"note": "x", "format": FORMAT})
    assert read_metadata(tagged)["note"] == "x"


def test_a_model_without_a_spec_cannot_be_saved(tmp_path):
    with pytest.raises(ValueError, match=r"^the model has no \.spec; build it with specformer.build\(\) to save it$"):
        specformer.save(torch.nn.Linear(2, 2), tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


def test_load_asks_for_the_memory_of_the_model_and_the_file_side_by_side(saved, model, monkeypatch):
    asked = []
    monkeypatch.setattr(checkpoint, "check_memory", lambda need, **kw: asked.append((need, kw)))
    loaded = specformer.load(saved)
    checked = check_checkpoint(saved)
    assert asked == [(checked.shape.total_bytes() + weight_bytes(model),
                      {"what": f"loading {saved}", "device": "cpu"})]
    assert checked.shape.total_bytes() >= weight_bytes(model)
    for name, t in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name


def test_load_checks_against_the_registry_it_is_given(saved):
    from specformer.registry.discovery import get_registry

    registry = copy.copy(get_registry())
    registry._components = {kind: dict(named) for kind, named in registry._components.items()}
    del registry._components["ffn"]["swiglu"]  # the spec's feed-forward, not registered there
    with pytest.raises(CheckpointError, match=f"^{saved}: .*swiglu"):
        specformer.load(saved, registry=registry)


def test_load_puts_the_model_on_the_device_asked_for(saved):
    loaded = specformer.load(saved, device="meta")
    assert {p.device.type for p in loaded.parameters()} == {"meta"}


class DeclaredLayout:
    """A plugin that loads every checkpoint itself (as a quantization plugin does its own layout)."""

    def __init__(self):
        self.calls = []

    @hookimpl
    def specformer_load_checkpoint(self, checked, device):
        self.calls.append((checked.path, device))
        return "loaded by the plugin"


def test_a_plugin_that_declared_the_layout_loads_the_checkpoint(saved):
    plugin = DeclaredLayout()
    manager = get_plugin_manager()
    manager.register(plugin, name="declared-layout-test")
    try:
        assert specformer.load(saved, device="meta") == "loaded by the plugin"
    finally:
        manager.unregister(plugin)
    assert plugin.calls == [(saved, "meta")]


def test_load_weights_keeps_one_saved_precision_and_casts_a_mix_to_the_model(model):
    halves = {name: t.to(torch.bfloat16) for name, t in model.state_dict().items()}
    target = specformer.build(TINY, seed=1)
    load_weights(target, halves, where="here")
    assert {t.dtype for t in target.state_dict().values()} == {torch.bfloat16}
    mixed = dict(model.state_dict())
    first = next(iter(mixed))
    mixed[first] = mixed[first].to(torch.float16)
    target = specformer.build(TINY, seed=1)
    load_weights(target, mixed, where="here")
    assert {t.dtype for t in target.state_dict().values()} == {torch.float32}
    assert torch.equal(target.state_dict()[first], model.state_dict()[first].half().float())


def test_load_weights_names_each_kind_of_problem(model):
    tensors = dict(model.state_dict())
    names = sorted(tensors)
    del tensors[names[0]], tensors[names[1]]
    tensors["extra.a"] = tensors["extra.b"] = torch.zeros(2)
    tensors[names[2]] = tensors[names[3]] = torch.zeros(3, 3)
    tensors[names[4]] = tensors[names[4]].to(torch.int32)
    tensors[names[5]] = tensors[names[5]].to(torch.int64)
    with pytest.raises(CheckpointError) as info:
        load_weights(specformer.build(TINY, seed=1), tensors, where="file.safetensors")
    message = str(info.value)
    assert message.startswith(f"file.safetensors: does not match its spec; missing tensors: {names[0]}, {names[1]}; ")
    assert "; unexpected tensors: extra.a, extra.b; " in message
    shapes = [tuple(model.state_dict()[n].shape) for n in names[2:4]]
    assert (f"; mis-shaped tensors: {names[2]} (checkpoint (3, 3), model {shapes[0]}), "
            f"{names[3]} (checkpoint (3, 3), model {shapes[1]}); ") in message
    assert ("; tensors that are not floating point where the model has float weights: "
            f"{names[4]} (torch.int32), {names[5]} (torch.int64); specformer does not cast") in message


# -- checkpoint_file.py -----------------------------------------------------------------


def test_a_failed_write_leaves_no_temporary_and_the_old_file_intact(tmp_path, model, saved, monkeypatch):
    before = saved.read_bytes()

    def full_disk(*args, **kwargs):  # the temporary is written; flushing it fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic, "fsync_file", full_disk)  # atomic.replacing, which checkpoint_file writes through
    with pytest.raises(OSError, match="No space left"):
        specformer.save(model, saved)
    assert saved.read_bytes() == before
    assert sorted(p.name for p in saved.parent.iterdir()) == ["tiny.safetensors"]


@pytest.mark.parametrize("header, detail", [
    ({}, "its header has no 'format' entry and no 'spec'"),
    ({"spec": "{}"}, "its header has no 'format' entry;"),
    ({"format": "specformer-checkpoint/2", "spec": "{}"}, "its format is 'specformer-checkpoint/2', which this version"),
    ({"format": "gguf"}, "its header says format 'gguf';"),
])
def test_a_header_of_another_format_says_what_it_found(tmp_path, header, detail):
    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(1)}, str(path), metadata=header or None)
    with pytest.raises(CheckpointError) as info:
        read_metadata(path)
    message = str(info.value)
    assert message.startswith(f"{path}: a safetensors file but not a specformer checkpoint (")
    assert detail in message and message.endswith(f"expected format {FORMAT!r})")


def test_a_specformer_header_without_its_spec_is_damaged(tmp_path):
    path = tmp_path / "nospec.safetensors"
    save_file({"w": torch.zeros(1)}, str(path), metadata={"format": FORMAT})
    with pytest.raises(CheckpointError, match=r"a specformer checkpoint header without its 'spec' entry"):
        read_metadata(path)


def test_reading_tensors_of_a_damaged_file_says_so(tmp_path, saved):
    assert read_tensors(saved, device="cpu").keys() == read_tensors(saved).keys()
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
    with pytest.raises(CheckpointError, match=rf"{broken}: cannot read tensors \(SafetensorError: "):
        read_tensors(broken)
    with pytest.raises(CheckpointError, match=r"cannot read tensors \(SafetensorError: device nonsense is invalid\)"):
        read_tensors(saved, device="nonsense")  # the device is passed on to safetensors
    with pytest.raises(CheckpointError, match=r"not a readable safetensors checkpoint \(SafetensorError: "):
        read_metadata(broken)
    too_long = tmp_path / ("x" * 300)
    with pytest.raises(CheckpointError, match=r"x': cannot be opened \(File name too long\)"):
        read_metadata(too_long)
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'none.safetensors'}: no such checkpoint file"):
        read_metadata(tmp_path / "none.safetensors")
    with pytest.raises(CheckpointError, match=rf"{tmp_path}: a directory without a checkpoint \(no model.safetensors"):
        read_metadata(tmp_path)


# -- checkpoint_check.py ----------------------------------------------------------------


def test_tensor_info_reads_kind_and_size_from_the_header():
    assert TensorInfo("BF16", (3, 4)).floating and TensorInfo("F8_E4M3", ()).floating
    assert not TensorInfo("I64", (2,)).floating and not TensorInfo("BOOL", (2,)).floating
    assert TensorInfo("F32", (3, 4)).nbytes == 48 and TensorInfo("BF16", (3, 4)).nbytes == 24
    assert TensorInfo("I64", (5,)).nbytes == 40 and TensorInfo("F32", ()).nbytes == 4
    assert TensorInfo("F8_E5M2", (7,)).nbytes == 7  # a dtype without a listed size counts one byte each


def test_the_check_reports_the_layout_of_the_file(saved, model):
    checked = check_checkpoint(saved)
    infos = tensor_infos(saved)
    assert checked.tensors == infos and checked.stored is None and checked.path == saved
    assert infos == {name: TensorInfo("F32", tuple(t.shape)) for name, t in model.state_dict().items()}
    assert checked.tensor_bytes == checked.stored_bytes == weight_bytes(model)
    assert checked.spec.to_json() == model.spec.to_json() and checked.resolved is checked.checked.resolved
    other = CheckedCheckpoint(path=saved, metadata={}, checked=checked.checked, tensors=infos,
                              stored={"q": TensorInfo("I8", (10,))})
    assert other.stored_bytes == 10 and other.tensor_bytes == weight_bytes(model)


def test_the_check_uses_the_header_it_is_given(saved):
    metadata = dict(read_metadata(saved))
    metadata["spec"] = "[1]"
    with pytest.raises(CheckpointError, match="the spec in the header is a JSON list"):
        check_checkpoint(saved, metadata=metadata)


def test_spec_data_returns_the_mapping_and_names_a_missing_spec(tmp_path):
    assert spec_data("x", {"spec": '{"model": {"d_model": 8}}'}) == {"model": {"d_model": 8}}
    with pytest.raises(CheckpointError, match=r"^x: the checkpoint header has no 'spec' entry"):
        spec_data("x", {})
    with pytest.raises(CheckpointError, match=r"is a JSON number \(1.5\), not a mapping"):
        spec_data("x", {"spec": "1.5"})


def test_a_spec_too_large_to_check_is_refused():
    text = json.dumps({"model": {}, "notes": [0] * 200_001})
    with pytest.raises(CheckpointError, match=r"^x: the spec in the header holds more than 200,000 values"):
        spec_data("x", {"spec": text})


def test_a_checkpoint_without_provenance_is_still_validated_against_the_given_registry(tmp_path, saved):
    from specformer.registry.discovery import get_registry

    metadata = dict(read_metadata(saved))
    del metadata["component_sources"]  # written before provenance was recorded: nothing to look up first
    registry = copy.copy(get_registry())
    registry._components = {kind: dict(named) for kind, named in registry._components.items()}
    del registry._components["ffn"]["swiglu"]
    with pytest.raises(CheckpointError, match="the spec stored in the checkpoint does not validate here"):
        check_checkpoint(saved, metadata=metadata, registry=registry)
    check_checkpoint(saved, metadata=metadata)


def test_layers_with_overrides_are_checked_with_their_own_shapes(tmp_path):
    spec = copy.deepcopy(TINY)
    spec["model"]["layers"] = [{"select": "1", "ffn": {"kind": "swiglu", "hidden": 64}}]
    model = specformer.build(spec, seed=0)
    path = specformer.save(model, tmp_path / "mixed.safetensors")
    checked = check_checkpoint(path)
    assert checked.tensors == {n: TensorInfo("F32", tuple(t.shape)) for n, t in model.state_dict().items()}
    for (name, a), b in zip(model.state_dict().items(), specformer.load(path).state_dict().values()):
        assert torch.equal(a, b), name


class QuantizedLayout:
    """A plugin declaring that ``<name>.q`` int8 tensors stand for the float tensor ``<name>``."""

    def __init__(self):
        self.calls = []

    @hookimpl
    def specformer_checkpoint_layout(self, metadata, tensors, where):
        if metadata.get("quantized") != "test":
            return None
        self.calls.append((dict(tensors), where))
        return {name.removesuffix(".q"): TensorInfo("F32", info.shape) for name, info in tensors.items()}


def test_a_plugin_declared_layout_is_checked_in_place_of_the_stored_one(tmp_path, model):
    path = tmp_path / "quantized.safetensors"
    metadata = {**read_metadata(specformer.save(model, tmp_path / "plain.safetensors")), "quantized": "test"}
    save_file({f"{n}.q": t.to(torch.int8) for n, t in model.state_dict().items()}, str(path), metadata=metadata)
    plugin = QuantizedLayout()
    manager = get_plugin_manager()
    manager.register(plugin, name="quantized-layout-test")
    try:
        checked = check_checkpoint(path)
    finally:
        manager.unregister(plugin)
    stored = tensor_infos(path)
    assert plugin.calls == [(stored, str(path))]
    assert checked.stored == stored and all(info.dtype == "I8" for info in stored.values())
    assert checked.tensors == {n: TensorInfo("F32", tuple(t.shape)) for n, t in model.state_dict().items()}
    assert checked.stored_bytes * 4 == checked.tensor_bytes == weight_bytes(model)


def test_tensor_infos_of_a_damaged_header_says_so(tmp_path):
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not safetensors")
    with pytest.raises(CheckpointError, match=rf"{broken}: cannot read the tensor list \(SafetensorError: "):
        tensor_infos(broken)


@pytest.fixture
def checked(saved):
    return check_checkpoint(saved)


def test_compare_layout_counts_tensors_first(checked):
    fewer = dict(checked.tensors)
    fewer.pop(next(iter(fewer)))
    count = len(checked.tensors)
    with pytest.raises(CheckpointError) as info:
        compare_layout(fewer, checked.resolved, checked.shape, where="w")
    size = sum(t.nbytes for t in fewer.values())
    assert str(info.value) == (f"w: does not match its spec: the spec describes a model of {checked.shape.parameters:,} "
                               f"parameters in {count:,} tensors, the file holds {count - 1:,} tensors ({size:,} bytes)")
    more = {**checked.tensors, "extra": TensorInfo("F32", (1,))}
    with pytest.raises(CheckpointError) as info:
        compare_layout(more, checked.resolved, checked.shape, where="w")
    assert str(info.value).endswith(f"the file holds {count + 1:,} tensors")


def test_compare_layout_names_renamed_misshaped_and_integer_tensors(checked):
    names = list(checked.tensors)
    renamed = {("other" if n == names[0] else n): t for n, t in checked.tensors.items()}
    with pytest.raises(CheckpointError) as info:
        compare_layout(renamed, checked.resolved, checked.shape, where="w")
    assert str(info.value) == f"w: does not match its spec; missing tensors: {names[0]}; unexpected tensors: other"
    changed = dict(checked.tensors)
    changed[names[1]] = TensorInfo("F32", (1, 2))
    changed[names[2]] = TensorInfo("I32", checked.tensors[names[2]].shape)
    with pytest.raises(CheckpointError) as info:
        compare_layout(changed, checked.resolved, checked.shape, where="w")
    message = str(info.value)
    assert message == (f"w: does not match its spec; mis-shaped tensors: {names[1]} (checkpoint (1, 2), model "
                       f"{checked.tensors[names[1]].shape}); tensors that are not floating point where the model has "
                       f"float weights: {names[2]} (I32); specformer does not cast integer or bool tensors into weights "
                       "(a quantized checkpoint needs a plugin that declares its layout)")
    order = [name for name, _, _ in expected_tensors(checked.resolved, checked.shape)]
    scanned = dict(checked.tensors)
    scanned["other"] = scanned.pop(order[0])  # missing first: the scan still goes on to the others
    scanned[order[-1]] = TensorInfo("F32", (1, 2))
    with pytest.raises(CheckpointError) as info:
        compare_layout(scanned, checked.resolved, checked.shape, where="w")
    assert f"missing tensors: {order[0]}; unexpected tensors: other; mis-shaped tensors: {order[-1]}" in str(info.value)
    compare_layout(checked.tensors, checked.resolved, checked.shape, where="w")  # the file's own layout passes


def test_long_lists_are_cut_after_eight():
    items = [str(i) for i in range(10)]
    assert _few(items) == "0, 1, 2, 3, 4, 5, 6, 7 and 2 more"
    assert _few(items[:8]) == "0, 1, 2, 3, 4, 5, 6, 7"
    assert _few(items, limit=2) == "0, 1 and 8 more"


def test_json_types_are_named_as_json_names_them():
    assert [_json_type(v) for v in ([], "s", 1, 1.5, True, None)] == [
        "list", "string", "number", "number", "boolean", "null"]
    assert _json_type({}) == "dict"


def test_an_empty_registry_given_is_used_not_replaced_by_the_default(saved):
    """An empty Registry is falsy (it has a length): ``registry or get_registry()`` silently checked against the
    installed components instead of the (empty) one the caller gave."""
    from specformer.registry.components import Registry

    metadata = dict(read_metadata(saved))
    del metadata["component_sources"]
    with pytest.raises(CheckpointError, match="the spec stored in the checkpoint does not validate here"):
        check_checkpoint(saved, metadata=metadata, registry=Registry())


def test_save_records_where_the_given_registrys_components_come_from(tmp_path, model):
    from dataclasses import replace

    from specformer.checkpoint.provenance import HEADER_KEY
    from specformer.registry.discovery import get_registry
    from specformer.registry.components import Registry

    everywhere = get_registry()
    given = Registry(kinds=dict(everywhere.kinds), sections=dict(everywhere.sections),
                     _components={kind: dict(names) for kind, names in everywhere._components.items()})
    for name, component in given._components["norm"].items():
        given._components["norm"][name] = replace(component, plugin="elsewhere")  # not the installed registry's
    path = specformer.save(model, tmp_path / "m.safetensors", registry=given)
    records = json.loads(read_metadata(path)[HEADER_KEY])
    assert {r["plugin"] for r in records if r["kind"] == "norm"} == {"elsewhere"}
    assert {r["plugin"] for r in records if r["kind"] == "ffn"} == {"layers"}
