"""Mellum's reading of a config.json without layer_types (parity with transformers: the mellum cases of test_parity)."""

from __future__ import annotations

import pytest

from specformer_hf.config import ConfigReader
from specformer_hf.family import get_families


def test_a_config_without_layer_types_reads_every_layer_as_full_attention():
    """transformers' MellumConfig fills layer_types with full_attention for every layer: no layer slides."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MellumConfig(num_hidden_layers=4).to_dict()
    assert set(config["layer_types"]) == {"full_attention"}  # what transformers makes of it
    config.pop("layer_types")
    family = get_families().get("mellum")
    spec = family.to_spec(ConfigReader(config, defaults=family.defaults, family=family.name))
    windows = [spec["block"]["mixer"].get("window")] + [o.get("mixer", {}).get("window") for o in spec.get("layers", [])]
    assert windows == [None] * len(windows), spec
