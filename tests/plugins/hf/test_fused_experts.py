"""Mixtures of experts in both checkpoint layouts transformers 5 uses.

transformers 5 holds a mixture's experts as fused 3-D tensors in memory
(``mlp.experts.gate_up_proj`` (n_experts, 2 * hidden, d_model), ``mlp.experts.down_proj``)
and ``save_pretrained`` converts them back to one tensor per expert; a file saved from the
module's own state dict keeps the fused layout. Import reads either; export writes what
``save_pretrained`` writes, so transformers loads it and the round trip stays bit-exact.
"""

from __future__ import annotations

import json

import pytest
import torch
from hf_cases import BY_NAME, SEQ_LEN
from safetensors.torch import load_file, save_file

import specformer_hf
from specformer.errors import UserError

MOE_CASES = [name for name in ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3", "kimi_linear", "glm4_moe",
                                             "minimax_m2", "laguna") if name in BY_NAME]


def _fused_folder(case_name: str, tmp_path):
    """A folder whose weights are the transformers module's own state dict (fused experts) and its config."""
    hf = BY_NAME[case_name].build()
    saved = tmp_path / "saved"
    hf.save_pretrained(saved)  # per-expert tensors, for comparison
    fused = tmp_path / "fused"
    fused.mkdir()
    state = {name: t.contiguous() for name, t in hf.state_dict().items()}
    if hf.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, fused / "model.safetensors", metadata={"format": "pt"})
    (fused / "config.json").write_text(json.dumps(hf.config.to_dict()), encoding="utf-8")
    return hf, saved, fused, state


@pytest.mark.parametrize("case_name", MOE_CASES)
def test_fused_expert_tensors_import_with_the_same_logits(case_name, tmp_path):
    hf, saved, fused, state = _fused_folder(case_name, tmp_path)
    assert any(name.endswith("experts.gate_up_proj") and t.dim() == 3 for name, t in state.items()), "not fused"
    model = specformer_hf.from_hf(fused)
    ids = torch.randint(0, model.vocab_size, (2, SEQ_LEN), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (model(ids) - hf(ids).logits).abs().max().item() <= 1e-4
    # The same weights as the per-expert file gives, bit for bit.
    per_expert = specformer_hf.from_hf(saved).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, per_expert[name]), name


@pytest.mark.parametrize("case_name", MOE_CASES)
def test_export_of_a_fused_import_writes_what_save_pretrained_writes(case_name, tmp_path):
    hf, saved, fused, _ = _fused_folder(case_name, tmp_path)
    out = specformer_hf.to_hf(specformer_hf.from_hf(fused), tmp_path / "export")
    original, exported = load_file(saved / "model.safetensors"), load_file(out / "model.safetensors")
    assert original.keys() == exported.keys()
    for name in original:
        assert torch.equal(original[name], exported[name]), name


def test_a_fused_file_missing_its_down_projection_names_the_per_expert_tensors(tmp_path):
    _, _, fused, state = _fused_folder("mixtral", tmp_path)
    del state["model.layers.0.mlp.experts.down_proj"]
    save_file(state, fused / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"missing tensors: model\.layers\.0\.block_sparse_moe\.experts\.0\.w2\.weight"):
        specformer_hf.from_hf(fused)
