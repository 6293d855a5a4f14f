"""Families whose attention has one key/value head per query head, each d_model / n_heads wide, refuse any other.

Their configs have no field for grouped queries or a head width of its own, so a spec with
either must be refused on export, naming the field (``SpecView.multi_head``), never written
as a model that computes something else.
"""

from __future__ import annotations

import copy

import pytest

import specformer
import specformer_hf
from specformer.errors import UserError

FAMILIES = ["ctrl", "openai-gpt", "opt", "gpt_neo", "biogpt", "xglm", "mpt", "bloom"]


@pytest.mark.parametrize("saved", FAMILIES, indirect=True)
@pytest.mark.parametrize(("change", "field"), [
    ({"n_kv_heads": 1}, "model.block.mixer.n_kv_heads"),
    ({"head_dim": 4}, "model.block.mixer.head_dim"),
])
def test_other_attention_sizes_are_refused_naming_the_field(tmp_path, saved, change, field):
    spec = copy.deepcopy(saved.imported.spec)
    spec["model"]["block"]["mixer"].update(change)
    model = specformer.build(spec, seed=0)
    with pytest.raises(UserError, match=field.replace(".", r"\.")):  # the spec as imported exports (test_parity)
        specformer_hf.to_hf(model, tmp_path / "out", family=saved.imported.family.model_type)
