"""ForwardContext: default positions and each layer's positional scheme (its masks are tested with the kernels)."""

from __future__ import annotations

import torch

from specformer.model.context import ForwardContext, default_positions
from specformer.model.positional import PositionalScheme


def test_default_positions_count_from_zero_in_every_row() -> None:
    assert default_positions(2, 3, device="cpu").tolist() == [[0, 1, 2], [0, 1, 2]]


def test_default_positions_are_made_on_the_requested_device() -> None:
    assert default_positions(2, 3, device="meta").device.type == "meta"


def test_each_layer_reads_its_own_positional_scheme_and_state() -> None:
    positions = torch.tensor([[0, 1]])
    model_level, first, second = PositionalScheme(), PositionalScheme(), PositionalScheme()
    per_layer = ForwardContext(positions=positions, positional=model_level, positional_state="model",
                               layer_schemes=[first, second], layer_states=["first", "second"])
    assert per_layer.positional_for(1) is second and per_layer.positional_state_for(1) == "second"
    assert per_layer.positional_for(0) is first and per_layer.positional_state_for(0) == "first"
    shared = ForwardContext(positions=positions, positional=model_level, positional_state="model")
    assert shared.positional_for(1) is model_level and shared.positional_state_for(1) == "model"
