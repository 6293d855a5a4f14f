"""The train: spec section and --set overrides."""

from __future__ import annotations

import pytest

import specformer
from specformer.errors import SpecError, UserError
from specformer_train.config import TrainConfig, TrainSpec
from specformer_train.overrides import apply_overrides, parse_value
from specformer_train.run import load_train_spec

from .conftest import tiny_train_spec


def test_defaults_are_valid_and_every_field_is_described() -> None:
    config = TrainSpec()
    assert config.schedule == "warmup_cosine" and config.tokenizer == "byte"
    for name, info in TrainSpec.model_fields.items():
        assert info.description, f"train.{name} has no description"


def test_section_is_registered_and_validated_with_paths() -> None:
    spec = specformer.load_spec(tiny_train_spec(lr=0.01))
    assert isinstance(spec.section("train"), TrainSpec)
    assert spec.section("train").lr == 0.01
    with pytest.raises(SpecError) as info:
        specformer.load_spec(tiny_train_spec(lr=-1, schedul="constant"))
    text = str(info.value)
    assert "train.lr" in text and "greater than 0" in text
    assert "train.schedul: unknown field" in text and "schedule" in text


@pytest.mark.parametrize("bad, needle", [
    ({"min_lr": 0.1, "lr": 0.01}, "min_lr (0.1) must not exceed lr (0.01)"),
    ({"betas": [0.9, 1.5]}, "betas must each be in [0, 1)"),
    ({"schedule": "cosine"}, "warmup_cosine"),
    ({"distributed": "horovod"}, "fsdp"),
])
def test_bad_values_name_what_is_accepted(bad: dict, needle: str) -> None:
    with pytest.raises(SpecError, match=None) as info:
        specformer.load_spec(tiny_train_spec(**bad))
    assert needle in str(info.value)


@pytest.mark.parametrize("text, value", [
    ("3e-4", 3e-4), ("1e3", 1000.0), ("42", 42), ("-7", -7), ("0.5", 0.5), ("true", True),
    ("null", None), ("bpe", "bpe"), ("[0.9, 0.99]", [0.9, 0.99]),
])
def test_values_are_yaml_scalars_with_plain_exponents_as_floats(text: str, value: object) -> None:
    parsed = parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_overrides_set_nested_keys_and_expand_bare_component_names() -> None:
    data = tiny_train_spec()
    out = apply_overrides(data, ["train.lr=3e-4", "model.block.norm.eps=1e-5", "train.betas=[0.9, 0.99]"])
    assert out["train"]["lr"] == 3e-4
    assert out["model"]["block"]["norm"] == {"kind": "rmsnorm", "eps": 1e-5}
    assert data["train"]["lr"] == 3e-3, "the input must not be modified"


@pytest.mark.parametrize("item, needle", [
    ("train.lr", "expected KEY=VALUE"),
    ("=3", "expected KEY=VALUE"),
    ("train..lr=3", "empty part"),
    ("train.lr.x=3", "train.lr is 0.003"),
])
def test_malformed_overrides_are_user_errors(item: str, needle: str) -> None:
    with pytest.raises(UserError, match=None) as info:
        apply_overrides(tiny_train_spec(), [item])
    assert needle in str(info.value)


def test_overrides_are_validated_again(tmp_path) -> None:
    with pytest.raises(SpecError) as info:
        load_train_spec(tiny_train_spec(), overrides=["train.lrr=1"])
    assert "train.lrr: unknown field" in str(info.value)
    spec = load_train_spec(tiny_train_spec(), overrides=["train.lr=5e-4"], steps=3, data="somewhere", out_dir="o")
    config = spec.section("train")
    assert (config.lr, config.steps, config.data, config.out_dir) == (5e-4, 3, "somewhere", "o")


def test_the_section_models_are_the_cores_strict_numbers_under_one_naming() -> None:
    from pydantic import ValidationError

    from specformer.registry.params import StrictNumbers
    from specformer_generate import GenerateSpec
    from specformer_train.config import ParallelConfig

    import specformer_train

    assert TrainConfig is TrainSpec is specformer_train.TrainSpec and specformer_train.TrainConfig is TrainSpec
    assert issubclass(GenerateSpec, StrictNumbers)
    assert issubclass(TrainSpec, StrictNumbers) and issubclass(ParallelConfig, StrictNumbers)
    for bad, field in [({"steps": True}, "steps"), ({"lr": False}, "lr"), ({"betas": (True, 0.9)}, "betas"),
                       ({"parallel": {"tp": True}}, "parallel.tp")]:
        with pytest.raises(ValidationError, match="a boolean is not a number here") as info:
            TrainSpec(**bad)
        assert ".".join(map(str, info.value.errors()[0]["loc"])).startswith(field)
    for bad in ({"lr": float("inf")}, {"grad_clip": float("nan")}, {"betas": [0.9, float("inf")]}):
        with pytest.raises(ValidationError, match="Input should be a finite number"):
            TrainSpec(**bad)
    assert TrainSpec(steps=1e3, compile=True, document_mask=False).steps == 1000  # booleans where booleans go
