"""StateSlots: what a layer keeps per sequence, and the tensors whose rows grow with the tokens (per_tokens)."""

from __future__ import annotations

import pytest

from specformer.model.state import StateSlots


def test_a_tensor_per_tokens_gets_the_rows_a_length_needs_up_to_the_declared_ones() -> None:
    slots = StateSlots((("entries", (10, 4)), ("tail", (6, 2))), per_tokens=(("entries", 3),))
    assert slots.shapes_for(None) == {"entries": (10, 4), "tail": (6, 2)}
    assert slots.shapes_for(7) == {"entries": (3, 4), "tail": (6, 2)}  # ceil(7 / 3)
    assert slots.shapes_for(0)["entries"] == (1, 4) and slots.shapes_for(100)["entries"] == (10, 4)
    assert slots.bytes_per_sequence(2) == (40 + 12) * 2 and slots.bytes_per_sequence(2, 7) == (12 + 12) * 2


@pytest.mark.parametrize("per", [(("missing", 3),), (("entries", 0),)])
def test_per_tokens_names_a_declared_tensor_and_a_positive_count(per) -> None:
    with pytest.raises(ValueError, match="per_tokens names a declared tensor"):
        StateSlots((("entries", (10, 4)),), per_tokens=per)
