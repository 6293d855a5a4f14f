"""What the LayerNorm families of issue 46 refuse on export, each in one clear line (their parity runs in test_parity)."""

from __future__ import annotations

import pytest

import specformer
import specformer_hf
from specformer.errors import UserError
from fixtures.tiny import tiny_spec


def _spec(norm: dict, mixer: dict | None = None, ffn: dict | None = None) -> dict:
    return tiny_spec(
        vocab_size=64, n_layers=1, positional={"kind": "rope", "fraction": 0.5},
        block={"layout": "prenorm", "norm": norm, "mixer": {"kind": "attention", "n_heads": 2, **(mixer or {})},
               "ffn": ffn or {"kind": "mlp", "hidden": 48, "activation": "relu2", "bias": False}})


@pytest.mark.parametrize(("norm", "family", "needle"), [
    # Nemotron's LayerNorm1P scales by 1 + w: a plain LayerNorm's weights would be read one too large.
    ({"kind": "layernorm"}, "nemotron", r"model\.block\.norm\.offset.*scale by 1 \+ weight"),
    ({"kind": "layernorm", "offset": 1.0, "bias": False}, "nemotron", r"have a weight and a bias"),
    # ... and a LayerNorm family without the offset refuses one that has it.
    ({"kind": "layernorm", "offset": 1.0}, "stablelm", r"model\.block\.norm\.offset.*scale by their weight"),
])
def test_layernorm_export_refuses_another_norm(tmp_path, norm, family, needle):
    ffn = {"kind": "swiglu", "hidden": 48} if family == "stablelm" else None
    with pytest.raises(UserError, match=needle):
        specformer_hf.to_hf(specformer.build(_spec(norm, ffn=ffn), seed=0), tmp_path / "out", family=family)


@pytest.mark.parametrize(("norm", "needle"), [
    # OlmoLayerNorm has no weight, no bias and no eps setting.
    ({"kind": "layernorm", "affine": False, "eps": 1e-6}, r"model\.block\.norm\.eps.*always use eps 1e-05"),
    ({"kind": "layernorm"}, r"have no weight and no bias"),
])
def test_olmo_export_refuses_another_norm(tmp_path, norm, needle):
    spec = _spec(norm, ffn={"kind": "swiglu", "hidden": 48})
    spec["model"]["positional"] = {"kind": "rope"}
    with pytest.raises(UserError, match=needle):
        specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="olmo")


def test_olmo_clip_qkv_round_trips_through_the_config(tmp_path):
    import json

    spec = _spec({"kind": "layernorm", "affine": False}, mixer={"clip_qkv": 8.0}, ffn={"kind": "swiglu", "hidden": 48})
    spec["model"]["positional"] = {"kind": "rope"}
    out = specformer_hf.to_hf(specformer.build(spec, seed=0), tmp_path / "out", family="olmo")
    assert json.loads((out / "config.json").read_text())["clip_qkv"] == 8.0
