"""Tensor-parallel plans without processes: the per-part row order, what components declare and refuse, and the
settings that start a tensor-parallel run (tests/plugins/train/test_tensor_parallel.py trains with them)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import specformer
from specformer.errors import UserError
from specformer.model.tensor_parallel import (FusedColwiseParallel, put_in_rank_order, rank_major_order,
                                              restore_row_order)
from specformer_train.config import TrainConfig
from specformer_train.distributed import resolve_mode
from specformer_train.tensor_parallel import clip_grad_norm

from fixtures.tiny import tiny_spec


def test_fused_rows_are_laid_out_part_by_part_for_each_rank() -> None:
    # parts q (4 rows), k (2), v (2) over 2 ranks: rank 0 holds q0 q1 k0 v0, rank 1 q2 q3 k1 v1
    assert rank_major_order((4, 2, 2), 2).tolist() == [0, 1, 4, 6, 2, 3, 5, 7]
    weight = torch.randn(8, 3)
    order = rank_major_order((4, 2, 2), 2)
    assert torch.equal(restore_row_order(put_in_rank_order(weight, order), order), weight)


def test_attention_splits_its_heads_and_fused_qkv_per_part() -> None:
    model = specformer.build(tiny_spec())  # 4 query heads, 2 key/value heads, head_dim 8
    attention = model.blocks[0].attention
    plan = attention.tensor_parallel(2)
    assert isinstance(plan["qkv"], FusedColwiseParallel) and plan["qkv"].parts == (32, 16, 16)
    assert isinstance(plan["out"], RowwiseParallel)
    assert (attention.n_heads, attention.n_kv_heads, attention.kv_splits) == (2, 1, (8, 8))


def test_gated_and_plain_ffns_split_their_hidden_channels() -> None:
    gated = specformer.build(tiny_spec()).blocks[0].ffn  # swiglu, hidden 48
    plan = gated.tensor_parallel(2)
    assert plan["gate_up"].parts == (48, 48) and isinstance(plan["down"], RowwiseParallel)
    assert gated.hidden == 24
    plain = specformer.build(tiny_spec(block={"ffn": {"kind": "mlp", "hidden": 64}})).blocks[0].ffn
    plan = plain.tensor_parallel(2)
    assert isinstance(plan["fc_in"], ColwiseParallel) and isinstance(plan["fc_out"], RowwiseParallel)


@pytest.mark.parametrize(("attention", "message"), [
    ({"kind": "attention", "n_heads": 4, "n_kv_heads": 1}, "n_kv_heads (1) must both divide by tp=2"),
    ({"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "sinks": True}, "with sinks yet"),
])
def test_attention_refuses_what_it_cannot_split(attention: dict, message: str) -> None:
    layer = specformer.build(tiny_spec(block={"attention": attention})).blocks[0].attention
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        layer.tensor_parallel(2)


def test_the_gated_ffn_refuses_hidden_channels_that_do_not_divide() -> None:
    ffn = specformer.build(tiny_spec(block={"ffn": {"kind": "swiglu", "hidden": 50}})).blocks[0].ffn
    with pytest.raises(ValueError, match=r"hidden \(50\) must divide by tp=4"):
        ffn.tensor_parallel(4)


def test_the_parallel_setting_is_validated_and_needs_a_matching_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TrainConfig().parallel.tp == 1
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        TrainConfig(parallel={"tp": 0})
    with pytest.raises(ValueError, match="Extra inputs"):
        TrainConfig(parallel={"pp": 2})
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(UserError, match=r"needs a multiple of 2 processes launched by torchrun \(now none\)"):
        resolve_mode("auto", tp=2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(UserError, match=r"needs a multiple of 2 processes .*\(now 3\)"):
        resolve_mode("fsdp", tp=2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UserError, match="set train.distributed=fsdp to shard the model across the 2 tensor-parallel"):
        resolve_mode("auto", tp=2)
    with pytest.raises(UserError, match="must be auto .* or fsdp .*, not ddp"):
        resolve_mode("ddp", tp=2)
    assert resolve_mode("fsdp", tp=2) == "fsdp"
    assert resolve_mode("auto", tp=4) == "tp"


def test_the_norm_of_replicated_gradients_is_torchs() -> None:
    torch.manual_seed(0)
    ours = [torch.nn.Parameter(torch.randn(3, 4)) for _ in range(3)]
    theirs = [torch.nn.Parameter(p.detach().clone()) for p in ours]
    for a, b in zip(ours, theirs):
        a.grad = torch.randn_like(a)
        b.grad = a.grad.clone()
    expected = torch.nn.utils.clip_grad_norm_(theirs, 0.5)
    torch.testing.assert_close(clip_grad_norm(ours, 0.5), expected)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)
