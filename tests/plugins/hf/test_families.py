"""The family registry: the hook third-party plugins use, and the built-in families' defaults."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch

import specformer_hf
from specformer.errors import RegistryError
from specformer.registry.discovery import check_hooks, new_plugin_manager, register_plugin
from specformer_hf import plugin as hf_plugin
from specformer_hf.families import builtin_families
from specformer_hf.families import llama as llama_family


class ThirdParty:
    """A plugin adding a family for a made-up model_type that stores Llama's tensors."""

    @specformer_hf.hookimpl
    def specformer_hf_register_families(self, families):
        families.add(dataclasses.replace(llama_family.FAMILY, name="Tiny", model_type="tiny_llama",
                                         architecture="TinyForCausalLM", plugin="?"))


def _manager(*plugins):
    """Plugins loaded as start-up loads entry points: each registered, the hooks checked once all are in."""
    pm = new_plugin_manager()
    for name, plugin in plugins:
        register_plugin(pm, plugin, name=name, check=False)
    check_hooks(pm)
    return pm


def test_a_plugin_registered_before_the_hook_exists_adds_a_family(llama_dir, tmp_path):
    pm = _manager(("aaa_third_party", ThirdParty()), ("hf", hf_plugin))
    families = specformer_hf.get_families(pm)
    tiny = families.get("tiny_llama")
    assert tiny.plugin == "aaa_third_party"
    assert families.model_types()[:len(builtin_families())] == [f.model_type for f in builtin_families()]

    d = tmp_path / "m"
    shutil.copytree(llama_dir.directory, d)
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "model_type": "tiny_llama"}))
    imported = specformer_hf.import_hf(d, families=families)
    assert imported.family is tiny
    for name, tensor in llama_dir.model.state_dict().items():
        assert torch.equal(imported.model.state_dict()[name], tensor)


def test_two_plugins_adding_one_model_type_is_an_error_naming_both():
    class Clash:
        @specformer_hf.hookimpl
        def specformer_hf_register_families(self, families):
            families.add(dataclasses.replace(llama_family.FAMILY, plugin="?"))

    pm = _manager(("hf", hf_plugin), ("zzz_clash", Clash()))
    with pytest.raises(RegistryError, match="plugin 'zzz_clash' adds a family for model_type 'llama', already added by plugin 'hf'"):
        specformer_hf.get_families(pm)


class Wrong:
    @specformer_hf.hookimpl
    def specformer_hf_register_families(self, registry):
        pass


@pytest.mark.parametrize("order", [("wrong", "hf"), ("hf", "wrong")])
def test_a_hook_implementation_with_wrong_arguments_is_reported_naming_its_plugin(order):
    plugins = {"wrong": Wrong(), "hf": hf_plugin}
    with pytest.raises(RegistryError, match=r"(?s)plugin 'wrong': .*'registry'"):
        _manager(*[(name, plugins[name]) for name in order])


def test_a_family_hook_without_the_hf_plugin_is_an_unknown_hook():
    with pytest.raises(RegistryError, match="plugin 'aaa_third_party': unknown hook 'specformer_hf_register_families'"):
        _manager(("aaa_third_party", ThirdParty()))


def test_the_installed_plugin_manager_knows_the_builtin_families():
    assert specformer_hf.get_families().model_types()[:11] == [
        "gpt2", "gpt_neox", "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo2"]


@pytest.mark.parametrize("family", builtin_families(), ids=lambda f: f.model_type)
def test_family_defaults_are_the_transformers_config_defaults(family):
    """A saved config.json may leave fields out; what we assume for them must be what transformers assumes."""
    import transformers

    config_class = transformers.CONFIG_MAPPING[family.model_type]
    fields = {f.name: f.default for f in dataclasses.fields(config_class)}
    made = config_class()  # what the config holds once built: a field defaulting to None may be filled in then
    for key, value in family.defaults.items():
        if key == "rope_parameters":
            assert {k: made.rope_parameters[k] for k in value} == value
        else:
            assert key in fields, key
            assert fields[key] == value or (fields[key] is None and getattr(made, key) == value), key
    # An alias (EXAONE 3, InternLM3, IQuest-Coder) has a config class of its own but runs as another family's model.
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert (getattr(transformers, family.architecture).config_class is config_class
            or MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(family.model_type) == family.architecture)


def test_the_docs_family_table_lists_every_builtin_family():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[3] / "docs" / "interop.md").read_text()
    page = page.split("\n## Families\n", 1)[1].split("\n## ", 1)[0]  # the families table, not the parts table
    rows = [line for line in page.splitlines() if line.startswith("| ") and line.split("|")[2].strip().startswith("`")][1:]
    documented = [line.split("|")[2].strip().strip("`") for line in rows]
    assert documented == [f.model_type for f in builtin_families()]
