"""Beam's decode through our cache against transformers (parity of whole forwards: the beam cases of test_parity),
and its refusals.

The query length scale of Beam's global layers reads each token's absolute position, so
logits decoded one token at a time through our cache must equal transformers' forward over
the whole sequence at every decode position, not only in the prompt.
"""

from __future__ import annotations

import json

import pytest
import torch
from fixtures.caching import cached_logits
from hf_cases import BY_NAME

import specformer
import specformer_hf
from specformer.errors import UserError

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("beam")
    hf = BY_NAME["beam"].build()
    with torch.no_grad():
        for name, buffer in hf.named_buffers():  # the selection bias starts at 0: shake it, as test_parity does
            if name.endswith("e_score_correction_bias"):
                buffer.add_(torch.randn_like(buffer))
        for name, param in hf.named_parameters():  # the per-head gate biases start at 0 too
            if name.endswith("gate_bias"):
                param.add_(torch.randn_like(param))
    hf.save_pretrained(folder)
    return hf.eval(), specformer_hf.from_hf(folder).eval()


@torch.no_grad()
def test_cached_decode_matches_transformers_at_every_position(imported):
    hf, ours = imported
    ids = torch.randint(0, ours.vocab_size, (2, 40), generator=torch.Generator().manual_seed(5))
    reference = hf(ids).logits
    decoded, _ = cached_logits(ours, ids, prompt=6)
    assert (decoded - reference).abs().max().item() <= TOLERANCE
    # The query scale is seen at this tolerance: decoded without it, the logits move by more.
    global_layers = [b.mixer for b in ours.blocks if b.mixer.length_scale is not None]
    assert global_layers
    for mixer in global_layers:
        mixer.length_scale = (2048.0, 0.0)  # (1 + ...) ** 0: no scale
    try:
        unscaled, _ = cached_logits(ours, ids, prompt=6)
    finally:
        for mixer in global_layers:
            mixer.length_scale = (2048.0, 0.1)
    assert (unscaled - reference)[:, 6:].abs().max().item() > TOLERANCE


def test_rope_on_the_global_layers_is_refused(tmp_path):
    BY_NAME["beam"].build().save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["rope_parameters"]["full_attention"] = {"rope_type": "default", "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=r"rope_parameters.full_attention must be null"):
        specformer_hf.import_hf(tmp_path)


def test_export_refuses_a_gate_bias_tied_to_qkv_and_a_missing_depth_scale(tmp_path):
    BY_NAME["beam"].build().save_pretrained(tmp_path / "in")
    spec = specformer_hf.import_hf(tmp_path / "in").spec
    tied = json.loads(json.dumps(spec))
    tied["model"]["block"]["mixer"]["output_gate_bias"] = "with_qkv"
    with pytest.raises(UserError, match=r"output_gate_bias: head"):
        specformer_hf.to_hf(specformer.build(tied, seed=0), tmp_path / "tied", family="beam")
    plain = json.loads(json.dumps(spec))
    plain["model"]["block"]["layout"]["depth_scaled_residual"] = False
    with pytest.raises(UserError, match=r"depth_scaled_residual: true"):
        specformer_hf.to_hf(specformer.build(plain, seed=0), tmp_path / "plain", family="beam")
