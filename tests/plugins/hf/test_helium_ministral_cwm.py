"""Helium, Ministral and CWM beyond their parity cases: what transformers cannot load is refused, and the layer types
their config classes fill in when config.json has none are read as those classes fill them."""

from __future__ import annotations

import json

import pytest
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError
from fixtures.tiny import tiny_spec


def _folder(tmp_path, case_name: str, *, drop: tuple[str, ...] = (), **changes):
    case = BY_NAME[case_name]
    case.save(case.build(), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config = {k: v for k, v in config.items() if k not in drop}
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    return tmp_path


def _windows(imported) -> list:
    model = imported.model
    return [block.mixer.window for block in model.blocks]


def test_helium_refuses_heads_that_do_not_fill_the_hidden_size(tmp_path):
    """HeliumAttention's o_proj is hidden_size -> hidden_size: 4 heads of 24 (96 wide) for 64 cannot load."""
    folder = _folder(tmp_path, "helium", head_dim=24)
    with pytest.raises(UserError, match=r"num_attention_heads \(4\) x head_dim \(24\) must equal hidden_size \(64\)"):
        specformer_hf.import_hf(folder)


def test_helium_export_refuses_heads_that_do_not_fill_d_model(tmp_path):
    spec = tiny_spec(vocab_size=128, d_model=64, context_length=64, positional={"kind": "rope", "interleaved": True},
                     block={"mixer": {"kind": "attention", "n_heads": 4, "head_dim": 24},
                            "ffn": {"kind": "swiglu", "hidden": 96}})
    with pytest.raises(UserError, match="needs n_heads x head_dim = d_model"):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="helium")


def test_cwm_without_layer_types_attends_fully_every_fourth_layer_from_the_first(tmp_path):
    folder = _folder(tmp_path, "cwm", drop=("layer_types",))
    assert _windows(specformer_hf.import_hf(folder)) == [None, 8, 8, 8, None]


def test_ministral_without_layer_types_slides_in_every_layer_unless_the_window_is_null(tmp_path):
    assert _windows(specformer_hf.import_hf(_folder(tmp_path / "a", "ministral", drop=("layer_types",)))) == [8, 8, 8]
    folder = _folder(tmp_path / "b", "ministral", drop=("layer_types",), sliding_window=None)
    assert _windows(specformer_hf.import_hf(folder)) == [None, None, None]
