"""Bias balancing under data parallelism: every process applies the update of the whole global batch.

Two gloo processes each route their half of every step's tokens, then balance with the expert
loads summed over both (``balance_routers(model, ctx)``). Their selection biases must stay
identical, step after step, and equal those of one process routing the concatenated batch.
Each process also keeps a router balanced by its own half only: those differ between the
processes, so the comparison would catch a missing or wrong all-reduce.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file

from specformer_layers.routers.sigmoid_topk import SigmoidTopK
from specformer_train import router_balance
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.router_balance import balance_routers

#: One process of the check: argv = rank, world size, rendezvous file, output file. World size 1
#: (no process group) routes both halves at once: the single-process reference.
WORKER = '''
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from specformer_layers.routers.sigmoid_topk import SigmoidTopK
from specformer_train.parallel.layout import ParallelLayout
from specformer_train.router_balance import balance_routers

rank, world, rendezvous, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
torch.set_num_threads(1)
STEPS, PER_RANK, D, EXPERTS = 6, 48, 16, 8
generator = torch.Generator().manual_seed(0)
tokens = torch.randn(STEPS, 2, PER_RANK, D, generator=generator)  # (step, rank, token, D)
tokens[:, 1, :, 0] += 2.0  # the second half leans towards other experts than the first


def make_router() -> SigmoidTopK:
    router = SigmoidTopK(SigmoidTopK.Params(n_group=2, topk_group=1, bias_update_rate=0.01), d_model=D, n_experts=EXPERTS,
                         top_k=2)
    with torch.no_grad():
        router.weight.copy_(torch.randn(EXPERTS, D, generator=torch.Generator().manual_seed(1)))
    return router.train()


balanced, local = make_router(), make_router()
if world > 1:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    ctx = ParallelLayout(mode="ddp", rank=rank, world_size=world)
mine = tokens[:, rank] if world > 1 else tokens.flatten(1, 2)  # (step, tokens, D)
history, local_history = [], []
for step in range(STEPS):
    balanced(mine[step])
    balance_routers(balanced, ctx if world > 1 else None)
    history.append(balanced.selection_bias.clone())
    local(mine[step])
    balance_routers(local)  # this process's load alone
    local_history.append(local.selection_bias.clone())
save_file({"balanced": torch.stack(history), "local": torch.stack(local_history)}, out)
if world > 1:
    dist.destroy_process_group()
'''


def _run(tmp_path: Path) -> dict[str, dict[str, torch.Tensor]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    rendezvous = tmp_path / "rendezvous"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = {"single": ("0", "1"), "rank0": ("0", "2"), "rank1": ("1", "2")}
    processes = {name: subprocess.Popen([sys.executable, str(script), rank, world, str(rendezvous),
                                         str(tmp_path / f"{name}.safetensors")],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                 for name, (rank, world) in runs.items()}
    for name, process in processes.items():
        output, _ = process.communicate(timeout=240)
        assert process.returncode == 0, f"{name}: {output[-3000:]}"
    return {name: load_file(tmp_path / f"{name}.safetensors") for name in runs}


@pytest.mark.slow  # three Python processes importing torch: 10-35 s on two shared cores
@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                    reason="torch.distributed with the gloo backend is not available")
def test_two_gloo_processes_keep_identical_biases_equal_to_one_process(tmp_path: Path) -> None:
    got = _run(tmp_path)
    single, rank0, rank1 = got["single"]["balanced"], got["rank0"]["balanced"], got["rank1"]["balanced"]
    assert torch.equal(rank0, rank1), "the two processes' selection biases drifted apart"
    assert torch.equal(rank0, single), "the processes' biases differ from one process on the whole batch"
    assert single[-1].abs().sum() > 0  # the bias did move
    # Balanced by their own halves, the processes would disagree: the all-reduce is what keeps them equal.
    assert not torch.equal(got["rank0"]["local"], got["rank1"]["local"])


def test_the_update_sums_the_load_over_processes_before_taking_its_sign(monkeypatch: pytest.MonkeyPatch) -> None:
    """In process: all_reduce replaced by adding the other process's counts, as a SUM over two ranks would."""
    torch.manual_seed(0)
    halves = torch.randn(2, 40, 16)
    halves[1, :, 0] += 2.0

    def router() -> SigmoidTopK:
        r = SigmoidTopK(SigmoidTopK.Params(bias_update_rate=0.01), d_model=16, n_experts=8, top_k=2)
        with torch.no_grad():
            r.weight.copy_(torch.randn(8, 16, generator=torch.Generator().manual_seed(1)))
        return r.train()

    whole, this_rank, other_rank = router(), router(), router()
    whole(halves.flatten(0, 1))
    this_rank(halves[0])
    other_rank(halves[1])
    other_load = other_rank.observed_load.clone()
    assert not torch.equal(torch.sign(this_rank.observed_load - this_rank.observed_load.mean()),
                           torch.sign(whole.observed_load - whole.observed_load.mean()))  # a local update differs
    calls = []

    def all_reduce(tensor: torch.Tensor, op: object = None) -> None:
        calls.append(op)
        tensor.add_(other_load)

    monkeypatch.setattr(router_balance.dist, "all_reduce", all_reduce)
    assert balance_routers(this_rank, ParallelLayout(mode="ddp", rank=0, world_size=2)) == 1
    balance_routers(whole)  # no context: no all-reduce
    assert calls == [dist.ReduceOp.SUM]
    assert torch.equal(this_rank.selection_bias, whole.selection_bias)
    assert whole.selection_bias.abs().sum() > 0
