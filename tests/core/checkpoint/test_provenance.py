"""Checkpoints record which plugin provided each component, and say what to install when one is missing."""

from __future__ import annotations

import json
import types

import pytest
import torch
from pydantic import Field
from safetensors.torch import save_file

import specformer
from specformer.registry import discovery
from specformer.checkpoint.save_load import read_metadata, read_tensors
from specformer.cli.main import main
from specformer.errors import CheckpointError
from specformer.registry.hookspecs import hookimpl
from specformer.registry.params import Params
from specformer.checkpoint.provenance import HEADER_KEY


class AcmeNormParams(Params):
    eps: float = Field(default=1e-6, gt=0, description="Stability term.")


class AcmeNorm(torch.nn.Module):
    """x / max|x|, a norm only the 'acme' plugin provides."""

    def __init__(self, params: AcmeNormParams, *, dim: int) -> None:
        super().__init__()
        self.eps = params.eps
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / (x.abs().amax(dim=-1, keepdim=True) + self.eps) * self.weight


def _acme_plugin() -> types.SimpleNamespace:
    def register(registry):
        registry.register("norm", "acmenorm", factory=AcmeNorm, params=AcmeNormParams)

    return types.SimpleNamespace(specformer_register_components=hookimpl(register))


@pytest.fixture
def fresh_plugins():
    discovery.reset()
    yield
    discovery.reset()


@pytest.fixture
def acme_checkpoint(tmp_path, fresh_tiny_spec, fresh_plugins):
    """A checkpoint written while plugin 'acme' (distribution specformer-acme 1.2.3) was installed; then it is gone."""
    discovery.register_plugin(discovery.get_plugin_manager(), _acme_plugin(), name="acme",
                            distribution="specformer-acme", version="1.2.3")
    fresh_tiny_spec["model"]["block"]["norm"] = {"kind": "acmenorm", "eps": 1e-5}
    fresh_tiny_spec["model"]["block"]["mixer"]["qk_norm"] = "rmsnorm"  # a nested component is recorded too
    fresh_tiny_spec["generate"] = {"sampler": [{"kind": "top_k", "k": 5}, {"kind": "temperature", "value": 0.7}]}
    path = specformer.save(specformer.build(fresh_tiny_spec, seed=0), tmp_path / "acme.safetensors")
    discovery.reset()  # "uninstall": the plugin manager no longer knows 'acme'
    return path


def _version(dist: str) -> str:
    import importlib.metadata

    return importlib.metadata.version(dist)


def test_the_header_records_plugin_distribution_and_version_of_every_component(acme_checkpoint):
    records = json.loads(read_metadata(acme_checkpoint)[HEADER_KEY])
    by_name = {(r["kind"], r["name"]): r for r in records}
    assert by_name[("norm", "acmenorm")] == {
        "kind": "norm", "name": "acmenorm", "plugin": "acme", "distribution": "specformer-acme", "version": "1.2.3"}
    version = _version("specformer")
    for kind, name, plugin in [("mixer", "attention", "layers"), ("ffn", "swiglu", "layers"),
                               ("positional", "rope", "layers"), ("layout", "prenorm", "layers"),
                               ("norm", "rmsnorm", "layers"), ("sampler", "top_k", "generate"),
                               ("sampler", "temperature", "generate")]:
        assert by_name[(kind, name)] == {"kind": kind, "name": name, "plugin": plugin,
                                         "distribution": "specformer", "version": version}
    assert len(records) == len(by_name) == 8  # each component once, none invented


def test_loading_without_the_plugin_names_it_and_how_to_install_it(acme_checkpoint):
    with pytest.raises(CheckpointError) as info:
        specformer.load(acme_checkpoint)
    assert str(info.value) == (
        f"{acme_checkpoint}: the checkpoint was written with plugin 'acme' (distribution 'specformer-acme', "
        "version 1.2.3), which is not installed here; it provides norm 'acmenorm'. "
        "Install it with: pip install specformer-acme==1.2.3"
    )
    assert "did you mean" not in str(info.value)


def test_the_cli_says_the_same_and_exits_2(acme_checkpoint, capsys):
    assert main(["summary", str(acme_checkpoint)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {acme_checkpoint}: the checkpoint was written with plugin 'acme'")
    assert "pip install specformer-acme==1.2.3" in err and "Traceback" not in err


def test_with_the_plugin_installed_again_the_checkpoint_loads(acme_checkpoint):
    discovery.register_plugin(discovery.get_plugin_manager(), _acme_plugin(), name="acme",
                            distribution="specformer-acme", version="1.2.3")
    model = specformer.load(acme_checkpoint)
    assert isinstance(model.blocks[0].attention_norm, AcmeNorm)


def test_an_installed_plugin_that_lacks_the_component_says_which_version_wrote_it(acme_checkpoint):
    empty = types.SimpleNamespace(specformer_register_components=hookimpl(lambda registry: None))
    discovery.register_plugin(discovery.get_plugin_manager(), empty, name="acme",
                            distribution="specformer-acme", version="2.0.0")
    with pytest.raises(CheckpointError) as info:
        specformer.load(acme_checkpoint)
    assert str(info.value) == (
        f"{acme_checkpoint}: the checkpoint was written with plugin 'acme' (distribution 'specformer-acme', "
        "version 1.2.3); the version installed here (2.0.0) has no norm 'acmenorm'. "
        "Install the version it was written with: pip install specformer-acme==1.2.3"
    )


def test_a_plugin_registered_in_process_is_named_without_a_pip_command(tmp_path, fresh_tiny_spec, fresh_plugins):
    discovery.register_plugin(discovery.get_plugin_manager(), _acme_plugin(), name="acme")
    fresh_tiny_spec["model"]["block"]["norm"] = "acmenorm"
    path = specformer.save(specformer.build(fresh_tiny_spec, seed=0), tmp_path / "m.safetensors")
    discovery.reset()
    with pytest.raises(CheckpointError) as info:
        specformer.load(path)
    assert str(info.value) == (
        f"{path}: the checkpoint was written with plugin 'acme' (registered in-process, not from an installed "
        "distribution), which is not loaded here; it provides norm 'acmenorm'. Register that plugin before "
        "loading (specformer.registry.discovery.register_plugin)"
    )


def test_a_checkpoint_without_the_record_still_loads(tmp_path, fresh_tiny_spec):
    model = specformer.build(fresh_tiny_spec, seed=0)
    path = specformer.save(model, tmp_path / "new.safetensors")
    metadata = read_metadata(path)
    assert HEADER_KEY in metadata
    old = tmp_path / "old.safetensors"
    save_file(read_tensors(path), str(old), metadata={k: v for k, v in metadata.items() if k != HEADER_KEY})
    loaded = specformer.load(old)
    x = torch.randint(0, 97, (1, 5))
    assert torch.equal(loaded(x), model(x))


def test_a_checkpoint_without_the_record_and_a_missing_component_keeps_the_spec_message(acme_checkpoint, tmp_path):
    metadata = read_metadata(acme_checkpoint)
    old = tmp_path / "old.safetensors"
    save_file(read_tensors(acme_checkpoint), str(old), metadata={k: v for k, v in metadata.items() if k != HEADER_KEY})
    with pytest.raises(CheckpointError, match=r"does not validate here:(.|\n)*model.block.norm.kind: unknown norm 'acmenorm'"):
        specformer.load(old)
