"""Numbers in a spec are validated strictly: no booleans as sizes, no inf/nan, no sizes beyond storage."""

from __future__ import annotations

import copy
import math

import pytest
from pydantic import Field, ValidationError

import specformer
from specformer.errors import SpecError
from specformer.registry.params import Params, StrictNumbers
from specformer.registry.discovery import get_registry

from conftest import TINY


def _with(path: tuple[str, ...], value) -> dict:
    spec = copy.deepcopy(TINY)
    node = spec
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return spec


@pytest.mark.parametrize("path", [
    ("model", "n_layers"), ("model", "d_model"), ("model", "vocab_size"), ("model", "context_length"),
    ("model", "pad_vocab_to_multiple"), ("model", "init_std"), ("model", "embedding_multiplier"),
    ("model", "block", "mixer", "n_heads"), ("model", "block", "ffn", "hidden"),
])
@pytest.mark.parametrize("value", [True, False])
def test_a_boolean_is_not_a_size(path, value):
    with pytest.raises(SpecError) as info:
        specformer.load_spec(_with(path, value))
    assert f"{'.'.join(path)}: a boolean is not a number" in str(info.value)


def test_d_model_true_no_longer_reads_as_one():
    with pytest.raises(SpecError) as info:
        specformer.load_spec(_with(("model", "d_model"), True))
    assert "must divide d_model (1)" not in str(info.value)


def test_a_boolean_inside_a_list_of_indices_is_refused():
    spec = _with(("model", "layers"), [{"select": [0, True], "mixer": {"window": 4}}])
    with pytest.raises(SpecError, match=r"model.layers\[0\].select.*boolean is not a number"):
        specformer.load_spec(spec)


def test_boolean_fields_still_take_booleans():
    spec = _with(("model", "tie_embeddings"), False)
    assert specformer.load_spec(spec).model.tie_embeddings is False


@pytest.mark.parametrize("path", [
    ("model", "embedding_multiplier"), ("model", "init_std"), ("model", "logit_softcap"),
    ("model", "embedding_dropout"), ("model", "block", "norm"),
])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
def test_non_finite_floats_are_refused(path, value):
    if path[-1] == "norm":
        value = {"kind": "rmsnorm", "eps": value}
    with pytest.raises(SpecError, match="finite number"):
        specformer.load_spec(_with(path, value))


def test_every_registered_params_model_uses_the_strict_base():
    """The mechanism is central: every component's Params (layers, generate, any plugin) inherits it."""
    registry = get_registry()
    for component in registry:
        assert issubclass(component.params, StrictNumbers), f"{component.kind} {component.name}"


def test_the_strict_base_applies_to_a_third_party_params_model():
    class Mine(Params):
        width: int = Field(gt=0)
        ratio: float = 1.0
        ratios: list[float] = []
        flag: bool = False
        either: int | bool = 0
        wants_inf: float = Field(default=1.0, allow_inf_nan=True)

    with pytest.raises(ValidationError, match="boolean is not a number"):
        Mine(width=True)
    with pytest.raises(ValidationError, match="boolean is not a number"):
        Mine(width=2, ratios=[1.0, False])
    with pytest.raises(ValidationError, match="finite"):
        Mine(width=2, ratio=math.nan)
    ok = Mine(width=2, flag=True, either=True, wants_inf=math.inf)
    assert ok.flag is True and ok.either is True and ok.wants_inf == math.inf


def test_sizes_beyond_any_tensor_are_clear_spec_errors():
    for path, value in ((("model", "vocab_size"), 2**62), (("model", "d_model"), 2**70),
                        (("model", "block", "ffn", "hidden"), 2**66)):
        with pytest.raises(SpecError) as info:
            specformer.load_spec(_with(path, value))
        message = str(info.value)
        assert "too large" in message or "more than any machine can address" in message, message
        assert "frame #" not in message and len(message) < 800


def test_d_model_1e9_is_refused_as_unaddressable():
    spec = _with(("model", "d_model"), 1e9)
    # RoPE computes its (head_dim / 2) frequencies on the CPU even for a meta build: 1 GB here.
    spec["model"]["positional"] = {"kind": "none"}
    with pytest.raises(SpecError, match="more than any machine can address"):
        specformer.load_spec(spec)


def test_integers_from_set_are_exact_above_2_53():
    overrides = pytest.importorskip("specformer_train.overrides")
    assert overrides.parse_value(str(2**53 + 1)) == 2**53 + 1
    assert overrides.parse_value("-" + str(2**60 + 3)) == -(2**60 + 3)
    assert overrides.parse_value("3e-4") == pytest.approx(3e-4)


def test_the_field_types_give_a_plain_model_the_same_rules():
    from pydantic import BaseModel

    from specformer.spec.strict import StrictFloat, StrictInt

    class Nested(BaseModel):
        count: StrictInt = 1
        rate: StrictFloat = 0.5

    for bad, message in [({"count": True}, "a boolean is not a number here"), ({"rate": False}, "a boolean is not a number here"),
                         ({"rate": math.inf}, "finite number"), ({"rate": math.nan}, "finite number")]:
        with pytest.raises(ValidationError, match=message):
            Nested(**bad)
    assert Nested(count=1e3, rate=2) == Nested(count=1000, rate=2.0)


def test_a_boolean_inside_a_tuple_is_refused_too():
    class Pair(StrictNumbers):
        betas: tuple[float, float] = (0.9, 0.95)

    with pytest.raises(ValidationError, match="a boolean is not a number here"):
        Pair(betas=(True, 0.9))
