"""Registration mistakes a plugin author can make are reported when they happen, naming the plugin.

Each test registers through ``Registry.for_plugin("acme")`` exactly as a plugin's
``specformer_register_components`` hook does, and checks the message says which plugin,
which component, what is wrong, and what would be accepted.
"""

from __future__ import annotations

import types

import pytest
from pydantic import BaseModel, ConfigDict, Field
from specformer.registry import discovery
from specformer.errors import RegistryError
from specformer.registry.hookspecs import hookimpl
from specformer.registry.params import Params
from specformer.registry.components import Registry


class NormParams(Params):
    eps: float = Field(default=1e-6, gt=0, description="Stability term.")


def norm_factory(params: NormParams, *, dim: int) -> object:
    return ("norm", dim, params.eps)


@pytest.fixture
def acme() -> tuple[Registry, object]:
    registry = Registry()
    return registry, registry.for_plugin("acme")


def test_a_correct_registration_records_plugin_doc_and_source(acme):
    registry, view = acme
    component = view.register("norm", "acmenorm", factory=norm_factory, params=NormParams, paper="https://example.org/p")
    assert registry.get("norm", "acmenorm") is component
    assert component.plugin == "acme" and component.paper == "https://example.org/p"
    assert __name__ in component.source and "test_registry_errors.py" in component.source
    assert component.defaults() == {"eps": 1e-6}


def test_params_without_extra_forbid_is_refused_naming_plugin_and_fix(acme):
    _, view = acme

    class Lenient(BaseModel):  # pydantic's default ignores unknown keys: a misspelt key would vanish
        eps: float = 1e-6

    with pytest.raises(RegistryError) as info:
        view.register("norm", "lenient", factory=norm_factory, params=Lenient)
    message = str(info.value)
    assert "plugin 'acme', norm 'lenient'" in message
    assert "Lenient must set model_config = ConfigDict(extra='forbid')" in message


def test_params_allowing_extra_keys_is_refused(acme):
    _, view = acme

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")

    with pytest.raises(RegistryError, match=r"plugin 'acme', norm 'open': Open must set .*extra='forbid'"):
        view.register("norm", "open", factory=norm_factory, params=Open)


def test_params_that_is_not_a_pydantic_model_is_refused(acme):
    _, view = acme
    with pytest.raises(RegistryError, match=r"plugin 'acme', norm 'plain': params must be a pydantic BaseModel subclass, got <class 'dict'>"):
        view.register("norm", "plain", factory=norm_factory, params=dict)


def test_factory_requiring_a_size_its_kind_does_not_have_is_refused_with_the_expected_signature(acme):
    _, view = acme

    def needs_width(params, *, width):  # a norm receives dim=...; nobody passes width
        return None

    with pytest.raises(RegistryError) as info:
        view.register("norm", "widthy", factory=needs_width, params=NormParams)
    message = str(info.value)
    assert "plugin 'acme', norm 'widthy'" in message
    assert "must accept (params: NormParams, *, any of dim) as components of kind 'norm' do" in message
    assert "needs_width(params, *, width)" in message  # the signature it actually has


def test_factory_is_passed_only_the_sizes_it_names(acme):
    registry, view = acme
    seen = []

    def attention(params, *, d_model):  # needs no layer_index or n_layers
        seen.append(d_model)
        return d_model

    view.register("mixer", "lean", factory=attention, params=NormParams)
    component = registry.get("mixer", "lean")
    assert component.make(NormParams(), d_model=8, layer_index=0, n_layers=2) == 8 and seen == [8]


def test_factory_registered_by_path_is_imported_when_first_built(acme):
    registry, view = acme
    view.register("norm", "bypath", factory="fractions:Fraction", params=NormParams, doc="A number.")
    component = registry.get("norm", "bypath")
    assert component.factory_path == "fractions:Fraction" and component.doc == "A number."
    assert component.make(3, dim=4) == 3  # Fraction(3): imported now, and passed no size it does not name


def test_factory_path_that_cannot_be_imported_names_the_plugin_and_the_path(acme):
    registry, view = acme
    view.register("norm", "ghost", factory="no_such_module_here:Thing", params=NormParams, doc="x")
    with pytest.raises(RegistryError, match=r"plugin 'acme', norm 'ghost': factory 'no_such_module_here:Thing' cannot"):
        registry.get("norm", "ghost").make(NormParams(), dim=4)
    with pytest.raises(RegistryError, match=r"must be a callable or 'package.module:Name'"):
        view.register("norm", "badpath", factory="not a path", params=NormParams)


def test_factory_that_does_not_take_params_is_refused(acme):
    _, view = acme

    def sizes_only(*, dim):
        return None

    with pytest.raises(RegistryError, match="plugin 'acme', norm 'sizesonly'.*must accept"):
        view.register("norm", "sizesonly", factory=sizes_only, params=NormParams)


def test_factory_with_catch_all_keywords_is_accepted(acme):
    registry, view = acme
    view.register("norm", "flexible", factory=lambda params, **sizes: sizes, params=NormParams)
    assert registry.get("norm", "flexible").factory(NormParams(), dim=4) == {"dim": 4}


def test_factory_that_is_not_callable_is_refused(acme):
    _, view = acme
    with pytest.raises(RegistryError, match=r"plugin 'acme', norm 'nope': factory 42 is not callable"):
        view.register("norm", "nope", factory=42, params=NormParams)


def test_name_clash_names_both_plugins_and_where_the_first_came_from():
    registry = Registry()
    registry.for_plugin("first").register("norm", "samename", factory=norm_factory, params=NormParams)
    with pytest.raises(RegistryError) as info:
        registry.for_plugin("second").register("norm", "samename", factory=norm_factory, params=NormParams)
    message = str(info.value)
    assert message.startswith("plugin 'second', norm 'samename': the name is already registered by plugin 'first'")
    assert "test_registry_errors:norm_factory" in message  # where the first registration lives (not imported for it)


def test_same_name_in_different_kinds_is_fine(acme):
    registry, view = acme
    view.add_kind("sampler", doc="A plugin's kind.")
    view.register("norm", "twin", factory=norm_factory, params=NormParams)
    view.register("sampler", "twin", factory=lambda params: None, params=NormParams)
    assert {c.kind for c in registry if c.name == "twin"} == {"norm", "sampler"}


def test_unknown_kind_lists_the_known_kinds(acme):
    _, view = acme
    with pytest.raises(RegistryError) as info:
        view.register("nrom", "x", factory=norm_factory, params=NormParams)
    assert "plugin 'acme', nrom 'x': unknown kind 'nrom'; did you mean 'norm'? known kinds: ffn, layout, mixer, norm, per_layer_input, positional" in str(info.value)


@pytest.mark.parametrize("name", ["", "has space", "dotted.name", "slash/name"])
def test_names_are_letters_digits_underscore_dash(acme, name):
    _, view = acme
    with pytest.raises(RegistryError, match="a name must be letters, digits, '_' or '-'"):
        view.register("norm", name, factory=norm_factory, params=NormParams)


def test_plugin_kind_is_usable_and_a_conflicting_redefinition_is_refused():
    registry = Registry()
    registry.for_plugin("acme").add_kind("router", doc="Chooses experts.", sizes=("d_model",))
    registry.for_plugin("acme").register("router", "top1", factory=lambda params, *, d_model: d_model, params=NormParams)
    assert registry.get("router", "top1").factory(NormParams(), d_model=8) == 8
    registry.for_plugin("other").add_kind("router", doc="Chooses experts.", sizes=("d_model",))  # identical: fine
    with pytest.raises(RegistryError, match="plugin 'other' redefines kind 'router', already defined differently"):
        registry.for_plugin("other").add_kind("router", doc="Chooses experts.", sizes=("d_model", "n_experts"))


def test_section_errors_name_the_plugin():
    registry = Registry()

    class TrainSection(Params):
        steps: int = Field(default=10, description="Steps.")

    class OtherSection(Params):
        steps: int = Field(default=10, description="Steps.")

    class LenientSection(BaseModel):
        steps: int = 10

    registry.for_plugin("trainer").add_section("train", TrainSection)
    with pytest.raises(RegistryError, match="plugin 'rival' registers spec section 'train', already registered by plugin 'trainer'"):
        registry.for_plugin("rival").add_section("train", OtherSection)
    with pytest.raises(RegistryError, match="plugin 'rival' cannot register the section 'model': the core owns it"):
        registry.for_plugin("rival").add_section("model", OtherSection)
    with pytest.raises(RegistryError, match=r"plugin 'rival', section 'lenient': LenientSection must set .*extra='forbid'"):
        registry.for_plugin("rival").add_section("lenient", LenientSection)


def test_a_plugin_hook_registering_badly_fails_the_registry_with_the_entry_point_name():
    """Through the real plugin manager: the name in the message is the plugin's registered name."""
    discovery.reset()
    try:
        pm = discovery.get_plugin_manager()

        class Sloppy(BaseModel):
            eps: float = 1.0

        sloppy = types.SimpleNamespace(
            specformer_register_components=hookimpl(
                lambda registry: registry.register("norm", "sloppynorm", factory=norm_factory, params=Sloppy)
            )
        )
        discovery.register_plugin(pm, sloppy, name="sloppy_plugin")
        with pytest.raises(RegistryError, match=r"plugin 'sloppy_plugin', norm 'sloppynorm': Sloppy must set"):
            discovery.build_registry(pm)
    finally:
        discovery.reset()


def test_building_keeps_the_registered_path_on_record(acme):
    registry, view = acme
    view.register("norm", "kept", factory="fractions:Fraction", params=NormParams, doc="A number.")
    component = registry.get("norm", "kept")
    component.make(3, dim=4)  # imports the factory
    assert component.factory_ref == component.factory_path == "fractions:Fraction"


def test_a_plugin_registering_the_old_kind_attention_registers_a_mixer_with_one_line(acme):
    from specformer.renamed import RenamedWarning

    registry, view = acme
    with pytest.warns(RenamedWarning, match=r"plugin 'acme' registering 'lean': kind 'attention': .* now called 'mixer'"):
        view.register("attention", "lean", factory=lambda params, *, d_model: d_model, params=NormParams)
    assert registry.get("mixer", "lean").kind == "mixer"
