"""The layout of a run's processes: built once from the settings and the launch, checked once, never changed."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specformer
from specformer.errors import UserError
from specformer_train.parallel.layout import ParallelLayout

from fixtures.tiny import tiny_spec


def test_a_layout_is_made_once_and_never_changed() -> None:
    layout = ParallelLayout(mode="fsdp", rank=5, world_size=8, tp=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.tp = 4  # type: ignore[misc]
    alone = ParallelLayout()
    assert alone.with_meshes("cpu") is alone and alone.meshes is None  # one process: no mesh to build


def test_the_meshes_are_built_once_from_one_world_mesh(tmp_path: Path) -> None:
    # A process group of one (gloo, in a process of its own): the world mesh is (dp, cp, tp) and the others its slices.
    code = (
        "import torch.distributed as dist\n"
        "from specformer_train.parallel.layout import ParallelLayout\n"
        f"dist.init_process_group('gloo', init_method='file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
        "layout = ParallelLayout(mode='fsdp', world_size=1)\n"
        "joined = layout.with_meshes('cpu')\n"
        "m = joined.meshes\n"
        "print(layout.meshes is None, joined == layout, m.world.mesh_dim_names, m.world.shape,"
        " [x.mesh_dim_names for x in (m.dp, m.cp, m.tp, m.sharded)], m.experts)\n"
        "dist.destroy_process_group()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == ("True True ('dp', 'cp', 'tp') (1, 1, 1) "
                                          "[('dp',), ('cp',), ('tp',), ('dp',)] None")


def test_ranks_are_laid_out_data_context_tensor() -> None:
    # 8 processes, cp 2, tp 2: rank 6 is (dp 1, cp 1, tp 0)
    layout = ParallelLayout(mode="ddp", rank=6, world_size=8, tp=2, cp=2)
    assert (layout.dp_size, layout.dp_rank, layout.cp_rank) == (2, 1, 1)
    assert layout.mesh() == {"processes": 8, "distributed": "ddp", "dp": 2, "tp": 2, "ep": 1, "cp": 2}
    with pytest.raises(ValueError, match="6 processes cannot be laid out with tp 4"):
        ParallelLayout(mode="tp", world_size=6, tp=4)


def test_one_process_without_a_launch_is_laid_out_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert ParallelLayout.of_launch(distributed="auto") == ParallelLayout()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    layout = ParallelLayout.of_launch(distributed="fsdp", tp=2, sequence_parallel=True)
    assert layout == ParallelLayout(mode="fsdp", rank=3, world_size=4, local_rank=1, tp=2, sequence_parallel=True)
    with pytest.raises(UserError, match="set train.distributed=fsdp to shard the model across the 2 tensor-parallel"):
        ParallelLayout.of_launch(distributed="auto", tp=2)


def test_the_layout_refuses_the_model_it_cannot_split() -> None:
    model = specformer.build(tiny_spec())
    sequence = ParallelLayout(mode="tp", world_size=2, tp=2, sequence_parallel=True)
    with pytest.raises(UserError, match=r"train.parallel.sequence_parallel: .*train.seq_len \(15\) must divide by 2"):
        sequence.check_model(model, seq_len=15, documents={}, masked_loss=False)
    context = ParallelLayout(mode="ddp", world_size=2, cp=2)
    with pytest.raises(UserError, match=r"train.parallel.cp 2: .*train.seq_len \(18\) must divide by 4"):
        context.check_model(model, seq_len=18, documents={}, masked_loss=False)
    with pytest.raises(UserError, match="train.document_mask is not split across processes yet"):
        context.check_model(model, seq_len=16, documents={"document_mask": True}, masked_loss=False)
    ParallelLayout().check_model(model, seq_len=15, documents={"document_mask": True}, masked_loss=True)
