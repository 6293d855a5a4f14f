"""Tensor-parallel plans without processes: the per-part row order, what components declare and refuse, and the
settings that start a tensor-parallel run (tests/plugins/train/test_tensor_parallel.py trains with them)."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

import specformer
from specformer.errors import UserError
from specformer.model.device_plan import parse_layout, plan_parallel
from specformer.model.parallel_plan import plan_of, shared_weights
from specformer.model.tensor_parallel import (FusedColwiseParallel, ShardOwnParameters, VocabParallelHead,
                                              put_in_rank_order, rank_major_order, restore_row_order, styles_from_plan)
from specformer.spec.check import estimate
from specformer_train.config import TrainSpec
from specformer_train.parallel.layout import resolve_mode
from specformer_train.parallel.tensor import clip_grad_norm, vocabulary_styles

from fixtures.tiny import tiny_spec


def test_fused_rows_are_laid_out_part_by_part_for_each_rank() -> None:
    # parts q (4 rows), k (2), v (2) over 2 ranks: rank 0 holds q0 q1 k0 v0, rank 1 q2 q3 k1 v1
    assert rank_major_order((4, 2, 2), 2).tolist() == [0, 1, 4, 6, 2, 3, 5, 7]
    weight = torch.randn(8, 3)
    order = rank_major_order((4, 2, 2), 2)
    assert torch.equal(restore_row_order(put_in_rank_order(weight, order), order), weight)


class _Group:
    """What a component's ``take_tensor_parallel_share`` reads of the tensor-parallel mesh: its size."""

    def __init__(self, size: int) -> None:
        self._size = size

    def size(self) -> int:
        return self._size


def _styles(module: torch.nn.Module, tp: int) -> dict:
    return styles_from_plan(module, plan_of(module), tp)


def test_attention_splits_its_heads_and_fused_qkv_per_part() -> None:
    model = specformer.build(tiny_spec())  # 4 query heads, 2 key/value heads, head_dim 8
    attention = model.blocks[0].mixer
    styles = _styles(attention, 2)
    assert isinstance(styles["qkv"], FusedColwiseParallel) and styles["qkv"].parts == (32, 16, 16)
    assert isinstance(styles["out"], RowwiseParallel)
    assert set(styles) == {"qkv", "out"}  # no gate, no sinks: the plan's optional parts are skipped
    attention.take_tensor_parallel_share(_Group(2))
    assert (attention.n_heads, attention.n_kv_heads, attention.kv_splits) == (2, 1, (8, 8))


def test_sinks_gate_and_per_head_norms_follow_the_heads() -> None:
    attention = specformer.build(tiny_spec(block={"mixer": {
        "kind": "attention", "n_heads": 4, "n_kv_heads": 2, "sinks": True, "output_gate": True,
        "qk_norm": {"kind": "rmsnorm"}}})).blocks[0].mixer
    styles = _styles(attention, 2)
    assert isinstance(styles["gate"], ColwiseParallel) and not isinstance(styles["gate"], FusedColwiseParallel)
    assert isinstance(styles[""], ShardOwnParameters) and styles[""].names == ("sinks",)
    # the norms on each head are kept whole and their gradients summed over the group
    assert shared_weights(attention, "tp") == ["q_norm.weight", "k_norm.weight"]


def test_gated_and_plain_ffns_split_their_hidden_channels() -> None:
    gated = specformer.build(tiny_spec()).blocks[0].ffn  # swiglu, hidden 48
    styles = _styles(gated, 2)
    assert styles["gate_up"].parts == (48, 48) and isinstance(styles["down"], RowwiseParallel)
    plain = specformer.build(tiny_spec(block={"ffn": {"kind": "mlp", "hidden": 64}})).blocks[0].ffn
    styles = _styles(plain, 2)
    assert type(styles["fc_in"]) is ColwiseParallel and isinstance(styles["fc_out"], RowwiseParallel)


def test_latent_attention_splits_its_up_projections_and_keeps_the_latents_whole() -> None:
    mla = {"kind": "mla", "n_heads": 4, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_rope_head_dim": 4,
           "qk_nope_head_dim": 8, "v_head_dim": 8}
    attention = specformer.build(tiny_spec(block={"mixer": mla})).blocks[0].mixer
    styles = _styles(attention, 2)
    assert {k: type(v) for k, v in styles.items()} == {"q_b": ColwiseParallel, "kv_b": ColwiseParallel,
                                                        "out": RowwiseParallel}


@pytest.mark.parametrize(("attention", "tp", "message"), [
    ({"kind": "attention", "n_heads": 6, "n_kv_heads": 3}, 4, r"splits query heads, and 6 do not divide by tp=4"),
    ({"kind": "attention", "n_heads": 12, "n_kv_heads": 3}, 4,
     r"splits key/value heads, and 3 do not divide by, or divide, tp=4"),
])
def test_sizes_that_do_not_split_are_refused_by_name(attention: dict, tp: int, message: str) -> None:
    layer = specformer.build(tiny_spec(d_model=48, block={"mixer": attention})).blocks[0].mixer
    with pytest.raises(ValueError, match=message):
        _styles(layer, tp)


def test_key_value_heads_fewer_than_tp_are_copied_one_per_process() -> None:
    attention = specformer.build(tiny_spec(block={"mixer": {"kind": "attention", "n_heads": 4,
                                                                "n_kv_heads": 2}})).blocks[0].mixer
    styles = _styles(attention, 4)
    assert styles["qkv"].parts == (32, 16, 16) and styles["qkv"].copied == (None, 2, 2)
    # queries: 8 rows a process; key/value head 0 (rows 32-39, 48-55) on processes 0 and 1, head 1 on 2 and 3
    order = rank_major_order((32, 16, 16), 4, (None, 2, 2)).view(4, -1).tolist()
    assert order[0] == [*range(0, 8), *range(32, 40), *range(48, 56)]
    assert order[1] == [*range(8, 16), *range(32, 40), *range(48, 56)]
    assert order[3] == [*range(24, 32), *range(40, 48), *range(56, 64)]
    gathered = put_in_rank_order(torch.randn(64, 3), rank_major_order((32, 16, 16), 4, (None, 2, 2)))
    assert gathered.shape == (96, 3)  # every process' rows, copies included
    restored = restore_row_order(gathered, rank_major_order((32, 16, 16), 4, (None, 2, 2)))
    assert restored.shape == (64, 3)
    attention.take_tensor_parallel_share(_Group(4))
    assert (attention.n_heads, attention.n_kv_heads, attention.kv_splits) == (1, 1, (8, 8))


@pytest.mark.parametrize(("attention", "message"), [
    ({"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "qk_norm": {"kind": "rmsnorm"}, "qk_norm_scope": "all"},
     "qk_norm_scope 'all' yet"),
    ({"kind": "compressed", "n_heads": 4, "head_dim": 8, "q_lora_rank": 8, "rope_dim": 8, "window": 3},
     "does not split compressed attention in training yet"),
])
def test_components_refuse_what_they_cannot_compute_split(attention: dict, message: str) -> None:
    layer = specformer.build(tiny_spec(block={"mixer": attention})).blocks[0].mixer
    with pytest.raises(ValueError, match=message):
        layer.take_tensor_parallel_share(_Group(2))


def test_the_gated_ffn_refuses_hidden_channels_that_do_not_divide() -> None:
    ffn = specformer.build(tiny_spec(block={"ffn": {"kind": "swiglu", "hidden": 50}})).blocks[0].ffn
    with pytest.raises(ValueError, match=r"gate_up.weight: tensor parallelism splits hidden channels, and 50 do not "
                                         r"divide by tp=4"):
        _styles(ffn, 4)


def test_the_parallel_setting_is_validated_and_needs_a_matching_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TrainSpec().parallel.tp == 1
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        TrainSpec(parallel={"tp": 0})
    with pytest.raises(ValueError, match="Extra inputs"):
        TrainSpec(parallel={"pp": 2})
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


@pytest.mark.parametrize(("model", "seq_len", "message"), [
    ({}, 31, r"train.seq_len \(31\) must divide by 2"),
    ({"per_layer_input": {"kind": "per_layer_embedding", "width": 4},
      "block": {"layout": {"kind": "sandwich", "layer_scale": True}}}, 32, "per-layer inputs"),
    ({"block": {"residual": {"kind": "mhc", "n_streams": 2}}}, 32, "a multi-stream residual"),
    ({"block": {"ffn": {"kind": "moe", "n_experts": 4, "top_k": 1, "router": {"kind": "hash"}}}}, 32, "hash routing"),
])
def test_sequence_parallelism_refuses_what_a_cut_stream_cannot_hold(model: dict, seq_len: int, message: str) -> None:
    from specformer_train.parallel.sequence import check_sequence_parallel

    built = specformer.build(tiny_spec(**{k: v for k, v in model.items() if k != "block"}, block=model.get("block")))
    with pytest.raises(ValueError, match=message):
        check_sequence_parallel(built, tp=2, seq_len=seq_len)


def test_sequence_parallelism_needs_tensor_parallelism() -> None:
    assert not TrainSpec().parallel.sequence_parallel
    with pytest.raises(ValueError, match="sequence_parallel cuts the stream between tensor-parallel sublayers"):
        TrainSpec(parallel={"sequence_parallel": True})
    assert TrainSpec(parallel={"tp": 2, "sequence_parallel": True}).parallel.sequence_parallel


@pytest.mark.parametrize(("model", "tp", "described"), [
    ({"vocab_size": 259, "tie_embeddings": True}, 2, "embedding and head whole (tied)"),  # specs/tiny.yaml's
    ({"vocab_size": 96, "tie_embeddings": True}, 2, "embedding and head whole (tied)"),  # divisible, still tied
    ({"vocab_size": 259, "tie_embeddings": False}, 2, "embedding and head by vocabulary"),  # uneven: 130 and 129
    ({"vocab_size": 96, "tie_embeddings": False, "lm_head_bias": True}, 4, "embedding and head by vocabulary"),
    ({"vocab_size": 259, "tie_embeddings": False, "pad_vocab_to_multiple": 8}, 2,
     "embedding and head whole (padded vocabulary)"),
    ({"vocab_size": 3, "tie_embeddings": False}, 4, "embedding and head whole (fewer vocabulary rows than tp)"),
])
def test_the_planner_and_the_trainer_split_the_embedding_and_head_alike(model: dict, tp: int, described: str) -> None:
    spec = tiny_spec(**model)
    vocabulary, styles = vocabulary_styles(specformer.build(spec), tp)  # what training would apply
    report = plan_parallel(estimate(spec), parse_layout(f"tp={tp}"))  # what `summary --parallel` prints
    assert vocabulary.describe() == report.vocabulary == described
    planned = {line.split(" (")[0] for line in report.split if "vocabulary rows" in line}
    assert planned == set(styles)  # the planner splits exactly the modules the trainer gives a style
    if vocabulary.split:
        assert isinstance(styles["embedding"], RowwiseParallel) and isinstance(styles["lm_head"], VocabParallelHead)
        assert f"lm_head (Linear): {'weight, bias' if model.get('lm_head_bias') else 'weight'} over tp by " \
               "vocabulary rows" in report.split


def test_a_per_head_gate_bias_follows_the_heads() -> None:
    """output_gate_bias head (Beam): the bias-free gate is split by rows, its per-head bias by heads with them."""
    attention = specformer.build(tiny_spec(block={"mixer": {
        "kind": "attention", "n_heads": 4, "n_kv_heads": 2, "output_gate": True, "output_gate_bias": "head"}})
    ).blocks[0].mixer
    styles = _styles(attention, 2)
    assert isinstance(styles["gate"], ColwiseParallel) and attention.gate.bias is None
    assert isinstance(styles[""], ShardOwnParameters) and styles[""].names == ("gate_head_bias",)
    attention.take_tensor_parallel_share(_Group(2))
    assert attention.n_heads == 2  # the gate's logits (B, T, 2 * hd) take the local two biases
