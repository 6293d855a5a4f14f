"""Expert parallelism without processes: the dispatch's split sizes and order, the groups, what a mixture keeps and
refuses, the settings that start an expert-parallel run, and the checkpoint's rows (tests/plugins/train/
test_expert_parallel.py trains with them on gloo processes)."""

from __future__ import annotations

import pytest
import torch

import specformer
from specformer.errors import UserError
from specformer.model.expert_parallel import (by_local_expert, expert_split_parameters, local_range, local_rows,
                                              send_sizes)
from specformer_train.config import TrainSpec
from specformer_train.parallel.layout import resolve_mode
from specformer_train.parallel.expert import (apply_expert_parallel, expert_groups_of, group_ranks,
                                              refuse_coupled_updates)
from specformer_train.optim import make_optimizer

from fixtures.tiny import tiny_spec

MOE = {"kind": "moe", "n_experts": 4, "top_k": 2, "hidden": 16, "n_shared_experts": 1, "expert_bias": True}


class FakeGroup:
    """What the contract reads of a process group: its size and this process' place in it."""

    def __init__(self, size: int, rank: int) -> None:
        self._size, self._rank = size, rank

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank


def test_each_process_owns_a_contiguous_range_of_whole_experts() -> None:
    assert [local_range(8, ep=4, rank=r) for r in range(4)] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    with pytest.raises(ValueError, match="n_experts 6 does not divide among ep=4 processes"):
        local_range(6, ep=4, rank=0)


def test_slots_reach_their_owners_and_are_regrouped_as_one_process_would_group_them() -> None:
    # Two processes, 4 experts (0-1 on process 0, 2-3 on process 1); each process' slots sorted by expert.
    counts = [torch.tensor([2, 0, 1, 3]), torch.tensor([1, 2, 0, 1])]
    slots = [[(source, e) for e, n in enumerate(c.tolist()) for _ in range(n)] for source, c in enumerate(counts)]
    assert send_sizes(counts[0], 2).tolist() == [2, 4] and send_sizes(counts[1], 2).tolist() == [3, 1]
    for owner in range(2):
        # what the all-to-all delivers: from each source, its block for this owner, sources in order
        arrived = []
        for source in range(2):
            sizes = send_sizes(counts[source], 2).tolist()
            start = sum(sizes[:owner])
            arrived += slots[source][start:start + sizes[owner]]
        received = torch.stack([c.view(2, 2)[owner] for c in counts])  # (ep, E_local): rows from s for expert e
        regrouped = [arrived[i] for i in by_local_expert(received).tolist()]
        # expert-major, each expert's rows by source: the order one process holding every expert sees
        assert regrouped == sorted(arrived, key=lambda slot: (slot[1], slot[0]))


def test_the_groups_are_consecutive_processes_and_replicas_share_a_place() -> None:
    assert group_ranks(4, 2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert group_ranks(2, 2) == ([[0, 1]], [[0], [1]])
    # beside tp 2 (ranks [dp][tp]): each tensor-parallel place splits its experts over the dp indices
    assert group_ranks(4, 2, tp=2) == ([[0, 2], [1, 3]], [[0], [2], [1], [3]])
    assert group_ranks(8, 2, tp=2) == ([[0, 2], [4, 6], [1, 3], [5, 7]], [[0, 4], [2, 6], [1, 5], [3, 7]])


def test_a_mixture_keeps_its_share_of_whole_experts_and_the_rest_whole() -> None:
    model = specformer.build(tiny_spec(block={"ffn": MOE}))
    full = {name: t.clone() for name, t in model.state_dict().items()}
    group = FakeGroup(2, 1)
    layout = apply_expert_parallel(model, group=group)
    assert layout.text == "expert parallel 2 ways: split 2 MoE, 2 of 4 experts on each process"
    names = [f"blocks.{i}.ffn.{p}" for i in range(2)
             for p in ("experts_in", "experts_out", "experts_in_bias", "experts_out_bias")]
    assert list(layout.params) == names == list(expert_split_parameters(model))
    state = model.state_dict()
    for name, tensor in state.items():
        if name in names:
            torch.testing.assert_close(tensor, full[name][2:4])  # the second process: experts 2 and 3
        else:
            torch.testing.assert_close(tensor, full[name])  # router, shared expert, attention, norms: whole
    assert set(expert_groups_of(layout).values()) == {group}
    # a full checkpoint cut back to this process' experts, its moments too; the step is left alone
    moments = {name: {"exp_avg": full[name] * 2, "step": torch.tensor(3.0)} for name in names}
    cut, optimizer = local_rows(model, full, {"state": moments, "param_groups": []})
    assert all(torch.equal(cut[name], state[name]) for name in state)
    assert torch.equal(optimizer["state"][names[0]]["exp_avg"], full[names[0]][2:4] * 2)
    assert optimizer["state"][names[0]]["step"] == 3.0


def test_experts_that_do_not_divide_and_a_model_without_experts_are_refused() -> None:
    three = specformer.build(tiny_spec(block={"ffn": {**MOE, "n_experts": 3}}))
    with pytest.raises(UserError, match=r"^train.parallel.ep 2: blocks.0.ffn \(MoE\): n_experts 3 does not divide "
                                        r"among ep=2 processes$"):
        apply_expert_parallel(three, group=FakeGroup(2, 0))
    dense = specformer.build(tiny_spec())
    with pytest.raises(UserError, match="train.parallel.ep 2: this model has no component that splits its experts"):
        apply_expert_parallel(dense, group=FakeGroup(2, 0))


def test_the_expert_parallel_setting_is_validated_and_needs_a_matching_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    assert TrainSpec().parallel.ep == 1
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        TrainSpec(parallel={"ep": 0})
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(UserError, match=r"needs a multiple of 2 processes launched by torchrun \(now none\)"):
        resolve_mode("auto", ep=2)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(UserError, match=r"^train.parallel.ep 2 needs a multiple of 2 processes .*\(now 3\)"):
        resolve_mode("ddp", ep=2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UserError, match="with train.parallel.tp 2: set train.distributed=fsdp"):
        resolve_mode("auto", ep=2, tp=2)
    assert resolve_mode("fsdp", ep=2, tp=2) == "fsdp"
    monkeypatch.setenv("WORLD_SIZE", "6")
    with pytest.raises(UserError, match=r"needs a multiple of 2 x tp 2 = 4 processes .*\(now 6\)"):
        resolve_mode("fsdp", ep=2, tp=2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UserError, match="must be auto, ddp or fsdp .*, not none"):
        resolve_mode("none", ep=2)
    assert resolve_mode("auto", ep=2) == "ddp"
    assert resolve_mode("fsdp", ep=4) == "fsdp"


@pytest.mark.parametrize("optimizer", ["muon", "adamw"])
def test_an_optimizer_that_updates_a_stack_as_one_matrix_is_refused(optimizer: str) -> None:
    model = specformer.build(tiny_spec(block={"ffn": MOE}))
    layout = apply_expert_parallel(model, group=FakeGroup(2, 0))
    built = make_optimizer(model, TrainSpec(optimizer={"kind": optimizer}), device=torch.device("cpu"))
    if optimizer == "adamw":  # element by element: a share of the experts updates as the whole would
        refuse_coupled_updates(built, layout)
        return
    with pytest.raises(UserError, match=r"^train.parallel.ep 2: the muon optimizer orthogonalises each expert stack "
                                        r"\(blocks.0.ffn.experts_in\) as one matrix"):
        refuse_coupled_updates(built, layout)


def test_per_expert_norms_split_with_their_experts_and_the_shared_norm_stays_whole() -> None:
    # Ergo's expert_norm: row e of expert_norm_weight is expert e's, so it goes where expert e goes.
    model = specformer.build(tiny_spec(block={"ffn": {**MOE, "expert_norm": "rmsnorm"}}))
    with torch.no_grad():
        for block in model.blocks:
            block.ffn.expert_norm_weight.normal_()
    full = {name: t.clone() for name, t in model.state_dict().items()}
    layout = apply_expert_parallel(model, group=FakeGroup(2, 1))
    assert "blocks.0.ffn.expert_norm_weight" in layout.params
    state = model.state_dict()
    torch.testing.assert_close(state["blocks.1.ffn.expert_norm_weight"], full["blocks.1.ffn.expert_norm_weight"][2:4])
    torch.testing.assert_close(state["blocks.1.ffn.shared_norm.weight"], full["blocks.1.ffn.shared_norm.weight"])
    # what the process runs for its local expert 0 (global expert 2) is normalised by expert 2's row
    ffn = model.blocks[0].ffn
    y = torch.randn(3, ffn.d_model)
    want = y / torch.sqrt(y.pow(2).mean(-1, keepdim=True) + ffn._expert_norm[0].eps) * full["blocks.0.ffn.expert_norm_weight"][2]
    torch.testing.assert_close(ffn.expert_normed(y, [ffn.expert_norm_weight[0]]), want)
