"""``specformer summary --parallel``: the plan on paper, checked against counts written out by hand."""

from __future__ import annotations

import json

import pytest
import yaml

from specformer.cli.main import main
from specformer.model.device_plan import parse_layout, plan_parallel
from specformer.spec.check import estimate

from fixtures.tiny import tiny_spec

# d_model 32, 2 layers, 4 query heads and 2 key/value heads of 8 channels, vocabulary 96 (tied).
MOE = tiny_spec(vocab_size=96, block={"ffn": {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16,
                                              "n_shared_experts": 1, "shared_hidden": 8}})
DENSE = tiny_spec(vocab_size=96)  # SwiGLU hidden 48


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_parameter_bytes_per_device_at_tp2_ep2_dp_shard2():
    r = plan_parallel(estimate(MOE), parse_layout("tp=2,ep=2,dp_shard=2"), dtype="bf16")
    # tp halves the heads' and hidden channels' rows (the tied embedding stays whole); ep halves the experts; FSDP
    # then halves the first dimension of everything (experts: dp_shard x tp / ep = 2 ways).
    embedding = 48 * 32  # (96, 32), whole over tp -> FSDP (48, 32)
    final_norm = 16
    layer = (16  # attention norm, replicated, FSDP-cut
             + 16 * 32  # qkv (64, 32): queries 32 -> 16 rows, keys 16 -> 8, values 16 -> 8; FSDP: 16 rows
             + 16 * 16  # out (32, 32): its 32 inputs -> 16; FSDP: 16 rows
             + 16  # ffn norm
             + 1 * 32 * 32  # experts_in (4, 32, 32): 2 experts per ep rank, 1 per FSDP shard
             + 1 * 32 * 16  # experts_out (4, 32, 16)
             + 2 * 32  # router (4, 32), replicated, FSDP-cut
             + 4 * 32  # shared gate_up (16, 32): gate 8 -> 4, up 8 -> 4; FSDP: 4 rows
             + 16 * 4)  # shared down (32, 8): inputs 8 -> 4; FSDP: 16 rows
    elements = embedding + final_norm + 2 * layer
    assert r.parameter_elements == elements == 6736
    assert r.parameters == r.gradients == 2 * elements
    assert r.optimizer == 12 * elements  # two fp32 moments and an fp32 master copy


def test_key_value_heads_fewer_than_tp_are_copied():
    r = plan_parallel(estimate(DENSE), parse_layout("tp=4"), dtype="fp32")
    layer = (2 * 32  # two norms, replicated
             + (8 + 8 + 8) * 32  # qkv: 32 query rows -> 8; 2 kv heads < 4: each device keeps one (8 rows) of k and v
             + 32 * 8  # out: 32 inputs -> 8
             + (12 + 12) * 32  # gate_up (96, 32): gate 48 -> 12, up 48 -> 12
             + 32 * 12)  # down (32, 48): 48 inputs -> 12
    assert r.parameter_elements == 96 * 32 + 32 + 2 * layer  # the tied embedding whole
    assert r.optimizer == 8 * r.parameter_elements  # fp32: two moments, no master copy


def test_activation_bytes_by_formula():
    r = plan_parallel(estimate(DENSE), parse_layout("tp=2"), dtype="fp32", batch=2, seq=16)
    # Every matmul keeps its input and its output: qkv 32 + 64, out 32 + 32, gate_up 32 + 96, down 48 + 32.
    per_layer = (32 + 64) + (32 + 32) + (32 + 96) + (48 + 32)
    tokens, fp32, tp = 2 * 16, 4, 2
    logits = tokens * 96 * 4  # fp32 logits, whole: the tied head is not split
    assert r.activations == tokens * 2 * per_layer * fp32 // tp + logits
    # Checkpointed: each layer's input (d_model) and one layer recomputed at a time.
    assert r.activations_checkpointed == tokens * (2 * 32 + per_layer) * fp32 // tp + logits
    # An untied head splits the logits by vocabulary, unevenly where tp does not divide it: 97 rows -> 49 and 48.
    untied = plan_parallel(estimate(tiny_spec(vocab_size=97, tie_embeddings=False)), parse_layout("tp=2"),
                           dtype="fp32", batch=2, seq=16)
    assert untied.activations == tokens * 2 * per_layer * fp32 // tp + tokens * 49 * 4


def test_communication_of_one_layout():
    r = plan_parallel(estimate(MOE), parse_layout("tp=2,ep=2,dp_shard=2,dp_replicate=2"), dtype="bf16", batch=1, seq=8)
    activation = 8 * 32 * 2  # one layer input, bf16
    # 2 attention + 2 ffn sublayers split over tp (the shared experts): 4 collectives each, half sent; the tied
    # embedding and head are whole, so they send nothing.
    assert r.comm["tp all-gather + reduce-scatter (layer inputs)"] == 4 * 4 * activation // 2
    untied = {**MOE, "model": {**MOE["model"], "tie_embeddings": False}}
    r = plan_parallel(estimate(untied), parse_layout("tp=2,ep=2,dp_shard=2,dp_replicate=2"), dtype="bf16", batch=1,
                      seq=8)
    # Split by vocabulary, the embedding and the head add one pair each.
    assert r.comm["tp all-gather + reduce-scatter (layer inputs)"] == 4 * (4 + 1) * activation // 2
    # 2 MoE layers x top_k 2 copies, 4 all-to-alls, half of each rank's tp-split tokens leave.
    assert r.comm["ep all-to-all (tokens, dispatch + combine)"] == 4 * 2 * 2 * activation // 2 // 2
    assert r.comm["dp_replicate all-reduce (gradients, fp32)"] == 2 * r.parameter_elements * 4 // 2


def test_a_component_without_a_plan_is_reported_replicated(capsys, tmp_path):
    spec = tiny_spec(vocab_size=96, positional={"kind": "learned"})
    path = tmp_path / "learned.yaml"
    path.write_text(yaml.safe_dump(spec))
    code, out, err = run(capsys, "summary", str(path), "--parallel", "tp=2")
    assert code == 0, err
    assert "replicated (no parallel_plan declared): positional (LearnedPositions)" in out
    assert "mixer (CausalSelfAttention): qkv, out over tp by query heads" in out
    code, out, _ = run(capsys, "summary", "--json", str(path), "--parallel", "tp=2,dp_shard=2", "--batch", "2")
    plan = json.loads(out)["parallel"]
    assert plan["replicated_without_plan"][0].startswith("positional") and plan["devices"] == 4


@pytest.mark.parametrize("value, message", [
    ("pp=2", "unknown axis 'pp'"),
    ("tp=2,pp=2", "unknown axis 'pp' (pipeline parallelism is not planned yet)"),
    ("tp=two", "tp='two' is not a whole number"),
    ("tp=1.5", "is not a whole number"),
    ("tp=0", "tp=0 must be at least 1"),
    ("tp", "is not AXIS=SIZE"),
    ("tp=3", "tp=3 must divide the 4 query heads of mixer.qkv.weight"),
    ("ep=3,dp_shard=3", "ep=3 must divide the 4 experts of ffn.experts_in"),
    ("ep=4,dp_shard=2", "ep=4 must divide dp_shard x cp x tp = 2"),
])
def test_bad_parallel_values_exit_2_with_one_line(capsys, tmp_path, value, message):
    path = tmp_path / "moe.yaml"
    spec = dict(MOE, model={**MOE["model"], "vocab_size": 96 * 3})  # a vocabulary 3 divides, so tp=3 trips on heads
    path.write_text(yaml.safe_dump(spec))
    code, out, err = run(capsys, "summary", str(path), "--parallel", value)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_sizing_flags_need_parallel(capsys):
    from conftest import SPECS

    code, _, err = run(capsys, "summary", str(SPECS / "tiny.yaml"), "--seq", "8")
    assert code == 2 and "give --parallel too" in err


def test_latent_attention_splits_its_up_projections_by_head():
    mla = {"kind": "mla", "n_heads": 4, "kv_lora_rank": 16, "qk_rope_head_dim": 4, "qk_nope_head_dim": 8,
           "v_head_dim": 8, "q_lora_rank": 16}
    r = plan_parallel(estimate(tiny_spec(vocab_size=96, block={"mixer": mla})), parse_layout("tp=2"))
    attention = (16 * 32 + 16 + 20 * 32 + 16  # q_a, q_norm, kv_a, kv_norm: the latents' side, replicated
                 + 24 * 16  # q_b (4 heads x 12, 16) -> 2 heads
                 + 32 * 16  # kv_b (4 heads x (8 + 8), 16) -> 2 heads
                 + 32 * 16)  # out (32, 4 heads x 8): its inputs -> 2 heads
    ffn = (24 + 24) * 32 + 32 * 24  # SwiGLU 48 -> 24 hidden channels: gate and up rows, down inputs
    assert r.parameter_elements == 96 * 32 + 32 + 2 * (2 * 32 + attention + ffn)  # the tied embedding whole


def test_context_parallel_splits_tokens_shards_weights_and_gathers_keys():
    one = plan_parallel(estimate(DENSE), parse_layout("dp_shard=2"), dtype="fp32", batch=1, seq=16)
    r = plan_parallel(estimate(DENSE), parse_layout("cp=2"), dtype="fp32", batch=1, seq=16)
    assert r.layout.devices == 2
    assert r.parameter_elements == one.parameter_elements  # FSDP shards across the cp devices as across dp_shard
    whole = plan_parallel(estimate(DENSE), parse_layout("dp_shard=1"), dtype="fp32", batch=1, seq=16)
    assert r.activations == whole.activations / 2  # each device keeps half of every row
    # Each of the 2 layers keeps 2 key heads and 2 value heads of 8 channels per token: 32 fp32 elements. The whole
    # row's (16 tokens) are gathered (half of them sent) and their gradients all-reduced (twice that).
    assert r.comm["cp all-gather (keys + values, fwd + bwd)"] == 2 * 3 * (16 * 32 * 4) // 2
    assert one.comm["cp all-gather (keys + values, fwd + bwd)"] == 0


def test_the_tied_embedding_of_the_tiny_spec_is_planned_whole_at_tp2(capsys):
    # 259 vocabulary rows, which 2 does not divide: a tied head keeps them whole, as training does
    # (tests/plugins/train/parallel/test_tensor_plans.py checks the trainer reads the same decision).
    from conftest import SPECS

    code, out, err = run(capsys, "summary", str(SPECS / "tiny.yaml"), "--parallel", "tp=2")
    assert code == 0, err
    assert "  vocabulary: embedding and head whole (tied)" in out
    assert "vocabulary rows" not in out
    code, out, _ = run(capsys, "summary", "--json", str(SPECS / "tiny.yaml"), "--parallel", "tp=2")
    assert code == 0 and json.loads(out)["parallel"]["vocabulary"] == "embedding and head whole (tied)"


@pytest.mark.parametrize("model, tp, rows, described", [
    ({"tie_embeddings": False}, 2, 130, "embedding and head by vocabulary"),  # 259 rows: 130 and 129
    ({"tie_embeddings": False}, 4, 65, "embedding and head by vocabulary"),  # 65, 65, 65, 64
    ({"tie_embeddings": False, "pad_vocab_to_multiple": 4}, 2, 260, "embedding and head whole (padded vocabulary)"),
    ({"tie_embeddings": True}, 2, 259, "embedding and head whole (tied)"),
])
def test_the_embedding_and_head_split_only_as_training_splits_them(model, tp, rows, described):
    r = plan_parallel(estimate(tiny_spec(vocab_size=259, **model)), parse_layout(f"tp={tp}"), dtype="fp32")
    assert r.vocabulary == described
    kv_rows = 2 * max(8, 16 // tp)  # 2 key/value heads of 8: fewer than tp=4 are copied, one per device
    layer = (2 * 32 + (32 // tp + kv_rows) * 32 + 32 * 32 // tp + 96 * 32 // tp + 32 * 48 // tp)
    head = 0 if model["tie_embeddings"] else rows * 32
    assert r.parameter_elements == rows * 32 + head + 32 + 2 * layer
    split = "embedding (Embedding): weight over tp by vocabulary rows" in r.split
    assert split == described.endswith("by vocabulary")
