"""Zamba2's shared blocks through the zamba2 family, beyond what test_parity.py's fp32 checks of the cases show.

A tiny Zamba2ForCausalLM (three hybrid layers over two alternating shared blocks, num_mem_blocks 2; per-use q/k/v and
gate_up adapters and per-use linears moved away from their initial values; mem RoPE), saved and imported: its
logits equal transformers' to 1e-5 in float64, and cached decoding equals the full forward to 1e-9, each use of a
shared block keeping a cache of its own. The family's one-line refusals: a hybrid first layer, and q/k/v adapters
with grouped keys (transformers' k/v adapters are 2 x hidden_size wide, so its own Zamba2 cannot run them).
"""

from __future__ import annotations

import pytest
import torch

from fixtures.caching import cached_logits
from specformer.errors import UserError

transformers = pytest.importorskip("transformers")
specformer_hf = pytest.importorskip("specformer_hf")

TYPES = ["mamba", "hybrid", "mamba", "hybrid", "hybrid", "mamba"]


def _config(**kw):
    fields = dict(vocab_size=101, hidden_size=32, num_hidden_layers=len(TYPES), layers_block_type=TYPES,
                  mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=2, n_mamba_heads=4, chunk_size=4,
                  intermediate_size=24, hidden_act="silu", num_attention_heads=2, num_key_value_heads=2,
                  num_mem_blocks=2, use_shared_attention_adapter=True, adapter_rank=4, use_mem_rope=True,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=64, pad_token_id=None,
                  bos_token_id=None, eos_token_id=None)
    return transformers.Zamba2Config(**{**fields, **kw})


def test_zamba2_imports_to_float64_logits_of_transformers_and_caches_each_use(tmp_path) -> None:
    torch.manual_seed(0)
    hf = transformers.Zamba2ForCausalLM(_config()).eval()
    with torch.no_grad():  # adapters, per-use linears and norms away from their initial values
        for n, p in hf.named_parameters():
            if "adapter" in n or "linear" in n.split(".")[-2] or "norm" in n:
                p.normal_(0, 0.3) if "norm" not in n else p.uniform_(0.5, 1.5)
    hf.save_pretrained(tmp_path)
    ours = specformer_hf.from_hf(tmp_path).double().eval()
    hf = hf.double()
    m = ours.spec.model
    # The k-th hybrid layer runs block k % 2; each block's adapters and each use's projection are the use's own.
    assert {o.shared: o.layer_indices(6) for o in m.layers} == {"shared_0": [1, 4], "shared_1": [3]}
    assert sorted(ours.shared_use_parts) == ["1", "3", "4"]
    ids = torch.randint(0, 101, (2, 11), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, rtol=1e-5, atol=1e-5)
        logits, _ = cached_logits(ours, ids, prompt=5)
        torch.testing.assert_close(logits, ours(ids), rtol=1e-9, atol=1e-9)


def test_a_hybrid_first_layer_is_refused_in_one_line(tmp_path) -> None:
    transformers.Zamba2ForCausalLM(_config(layers_block_type=["hybrid", *TYPES[1:]])).save_pretrained(tmp_path)
    with pytest.raises(UserError, match="layer 0 is 'hybrid'"):
        specformer_hf.from_hf(tmp_path)


def test_qkv_adapters_with_grouped_keys_are_refused_naming_the_fields() -> None:
    from specformer_hf.config import ConfigReader
    from specformer_hf.family import get_families

    family = get_families().get("zamba2")
    config = {**_config().to_dict(), "num_attention_heads": 4, "num_key_value_heads": 2}
    with pytest.raises(UserError, match="use_shared_attention_adapter needs num_key_value_heads == num_attention_heads"):
        family.to_spec(ConfigReader(config, defaults=family.defaults, family=family.name))


def test_export_refuses_shared_blocks_run_out_of_turn(tmp_path) -> None:
    torch.manual_seed(0)
    transformers.Zamba2ForCausalLM(_config()).save_pretrained(tmp_path / "hf")
    model = specformer_hf.from_hf(tmp_path / "hf")
    spec = model.spec.to_dict()
    spec["model"]["layers"] = [{"select": [1, 3], "shared": "shared_0"}, {"select": [4], "shared": "shared_1"}]
    import specformer

    other = specformer.build(spec, seed=0)
    with pytest.raises(UserError, match="runs its shared blocks in turn"):
        specformer_hf.to_hf(other, tmp_path / "out", family="zamba2")
