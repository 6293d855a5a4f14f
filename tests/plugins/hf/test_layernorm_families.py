"""What the LayerNorm families of issue 46 refuse on export, each in one clear line (their parity runs in test_parity)."""

from __future__ import annotations

import pytest

import specformer
import specformer_hf
from specformer.errors import UserError


def _spec(norm: dict, mixer: dict | None = None, ffn: dict | None = None) -> dict:
    return {"model": {
        "vocab_size": 64, "d_model": 32, "n_layers": 1, "context_length": 32,
        "positional": {"kind": "rope", "fraction": 0.5},
        "block": {"layout": "prenorm", "norm": norm, "mixer": {"kind": "attention", "n_heads": 2, **(mixer or {})},
                  "ffn": ffn or {"kind": "mlp", "hidden": 48, "activation": "relu2", "bias": False}},
    }}


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
