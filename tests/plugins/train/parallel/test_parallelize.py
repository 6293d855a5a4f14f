"""parallelize applies the layout's splits, recomputation, compilation and data parallelism in one fixed order."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed.fsdp

import specformer
import specformer_train.parallel.expert as expert
import specformer_train.parallel.parallelize as parallelize_module
import specformer_train.parallel.tensor as tensor
from specformer.errors import UserError
from specformer_train.parallel.layout import DeviceMeshes, ParallelLayout
from specformer_train.parallel.parallelize import ParallelModel, parallelize

from fixtures.tiny import tiny_spec


def test_the_steps_run_in_their_fixed_order(monkeypatch: pytest.MonkeyPatch) -> None:
    done: list[str] = []
    model = specformer.build(tiny_spec())

    def record(step: str, result: Any = None) -> Any:
        return lambda *args, **kwargs: done.append(step) or result

    monkeypatch.setattr(tensor, "apply_tensor_parallel", record("tensor", ("tensor parallel 2 ways", ("a.weight",))))
    monkeypatch.setattr(expert, "apply_expert_parallel", record("expert", SimpleNamespace(params={}, text="experts")))
    monkeypatch.setattr(parallelize_module, "enable_activation_checkpointing", record("recompute"))
    monkeypatch.setattr(torch.nn.Module, "compile", record("compile"))
    monkeypatch.setattr(torch.distributed.fsdp, "fully_shard", lambda module, **kw: done.append(
        "shard model" if module is model else "shard block"))
    meshes = DeviceMeshes(tp="tp mesh", sharded="dp mesh", experts="ep group")
    layout = ParallelLayout(mode="fsdp", world_size=4, tp=2, ep=2, sequence_parallel=True, meshes=meshes)
    got = parallelize(model, layout, device=torch.device("cpu"), activation_checkpointing=True, compile=True)
    assert done == ["tensor", "expert", "recompute", "compile", *["shard block"] * len(model.blocks), "shard model"]
    assert got.wrapped is model and got.tp_summed == ("a.weight",) and got.sequence.mesh == "tp mesh"
    assert got.description == "tensor parallel 2 ways; experts"


def test_one_process_runs_the_model_as_it_is() -> None:
    model = specformer.build(tiny_spec())
    got = parallelize(model, ParallelLayout(), device=torch.device("cpu"))
    assert got == ParallelModel(wrapped=model)


def test_a_split_needs_the_meshes_of_a_joined_process_group() -> None:
    with pytest.raises(ValueError, match="meshes are built once the process group is joined"):
        parallelize(specformer.build(tiny_spec()), ParallelLayout(mode="tp", world_size=2, tp=2),
                    device=torch.device("cpu"))


def test_muon_is_refused_beside_copied_key_value_heads() -> None:
    model = specformer.build(tiny_spec())
    optimizer = SimpleNamespace(param_groups=[{"use_muon": True, "params": []}])
    split = ParallelModel(wrapped=model, tp_copies={"blocks.0.mixer.qkv.weight": torch.arange(3)})
    with pytest.raises(UserError, match=r"train.parallel.tp 4: key/value heads .* \(blocks.0.mixer.qkv.weight\)"):
        split.check_optimizer(optimizer, ParallelLayout(mode="tp", world_size=4, tp=4))
    ParallelModel(wrapped=model).check_optimizer(optimizer, ParallelLayout())
