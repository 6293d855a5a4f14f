"""The "at least 2 taps" rule of a mixer's short convolution is declared once (ConvTaps) and reads the same everywhere."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specformer.registry.discovery import get_registry

#: Fields that set a causal convolution's taps, by the names the built-in mixers give them.
CONV_WIDTHS = ("conv_kernel", "kernel")
#: The other settings each mixer needs before its width is checked.
REQUIRED = {"gated_deltanet": {"n_heads": 4}, "kda": {"n_heads": 4}, "mamba2": {"n_heads": 4, "head_dim": 8},
            "mamba": {"d_inner": 32}, "rglru": {"width": 32}}


def _mixers_with_a_conv() -> list[tuple[str, str]]:
    registry = get_registry()
    found = []
    for name in registry.names("mixer"):
        fields = registry.get("mixer", name).params.model_fields
        found += [(name, field) for field in CONV_WIDTHS if field in fields]
    return found


def test_every_built_in_conv_mixer_is_found() -> None:
    found = dict(_mixers_with_a_conv())
    assert {"gated_deltanet", "kda", "mamba2", "short_conv"} <= set(found), found


@pytest.mark.parametrize(("name", "field"), _mixers_with_a_conv())
@pytest.mark.parametrize("taps", [0, 1])
def test_one_tap_is_refused_with_the_one_message_at_the_field(name: str, field: str, taps: int) -> None:
    params = get_registry().get("mixer", name).params
    with pytest.raises(ValidationError) as caught:
        params(**REQUIRED.get(name, {}), **{field: taps})
    errors = caught.value.errors()
    assert len(errors) == 1 and errors[0]["loc"] == (field,), errors
    assert errors[0]["msg"] == (f"Value error, {field} must be at least 2 (the causal convolution spans the token and at "
                                f"least one before it, and carries its last {field} - 1 inputs between forwards)")
    assert params.model_json_schema()["properties"][field]["minimum"] == 2
    assert getattr(params(**REQUIRED.get(name, {}), **{field: 2}), field) == 2
