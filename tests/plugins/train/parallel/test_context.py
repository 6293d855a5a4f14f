"""Context parallelism on CPU: gloo processes split each row's tokens, gather every attention layer's keys and values,
and train like one process on the same global batch (losses, gradient norms and weights to 1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from specformer.errors import UserError
import specformer
from specformer_train.parallel.context import check_context_parallel, positions_of
from specformer_train.parallel.layout import resolve_mode

from fixtures.tiny import tiny_spec
from .test_distributed import torchrun
from .parallel_runs import assert_same_run, one_and_parallel
from .test_tensor import DEEPSEEK_BLOCK

#: Context parallelism reads keys by position, so packed documents are not masked or restarted in these runs.
PLAIN_ROWS = {"document_mask": False, "reset_positions": False}

#: Grouped-query attention with a window shorter than a row (some chunks read none of another's keys) and sinks.
WINDOWED_BLOCK = {"mixer": {"kind": "attention", "n_heads": 4, "n_kv_heads": 2, "window": 12, "sinks": True},
                  "ffn": {"kind": "swiglu", "hidden": 64}}


def test_each_process_takes_an_early_and_a_late_chunk() -> None:
    assert positions_of(16, cp=2, rank=0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert positions_of(16, cp=2, rank=1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    every = torch.cat([positions_of(24, cp=3, rank=r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(24))


@pytest.mark.parametrize(("attention", "settings", "message"), [
    ({"kind": "attention", "n_heads": 4}, {"seq_len": 30}, r"train.seq_len \(30\) must divide by 4"),
    ({"kind": "gated_deltanet", "n_heads": 2}, {}, "layer 0's GatedDeltaNet keeps a state across tokens"),
    ({"kind": "attention", "n_heads": 4}, {"documents": {"document_mask": True}}, "train.document_mask: false"),
    ({"kind": "attention", "n_heads": 4}, {"documents": {"reset_positions": True}}, "train.reset_positions: false"),
    ({"kind": "attention", "n_heads": 4}, {"masked_loss": True}, "a loss mask"),
])
def test_what_context_parallelism_cannot_split_is_refused_in_one_line(attention: dict, settings: dict,
                                                                      message: str) -> None:
    model = specformer.build(tiny_spec(block={"mixer": attention}))
    given = {"seq_len": 32, "documents": {}, "masked_loss": False, **settings}
    with pytest.raises(UserError, match=message):
        check_context_parallel(model, cp=2, **given)


def test_the_launch_must_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(UserError, match=r"needs a multiple of 2 processes .*\(now 3\)"):
        resolve_mode("auto", cp=2)
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(UserError, match="context parallelism beside tensor or expert parallelism is not built yet"):
        resolve_mode("auto", tp=2, cp=2)
    with pytest.raises(UserError, match=r"train.parallel.cp 2 with train.parallel.ep 2: context parallelism beside"):
        resolve_mode("auto", ep=2, cp=2)
    with pytest.raises(UserError, match="must be auto, ddp or fsdp"):
        resolve_mode("none", cp=2)
    assert resolve_mode("auto", cp=2) == "ddp" and resolve_mode("fsdp", cp=2) == "fsdp"


needs_gloo = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with the gloo backend is not available")


#: DeepSeek-V3's shape (latent attention, a mixture with a shared expert and sigmoid routing) balanced by its routing
#: bias alone, as DeepSeek-V3 is: a load-balancing loss is taken per process, as under data parallelism, so it would
#: differ from one process' over the whole rows.
DEEPSEEK_BIAS_BALANCED = {**DEEPSEEK_BLOCK, "ffn": {**DEEPSEEK_BLOCK["ffn"], "aux_loss_coef": 0.0}}


@needs_gloo
@pytest.mark.slow
@pytest.mark.parametrize(("block", "distributed"), [(WINDOWED_BLOCK, "ddp"), (DEEPSEEK_BIAS_BALANCED, "fsdp")],
                         ids=["window-sinks-ddp", "mla-moe-fsdp"])
def test_two_context_parallel_processes_match_one(tmp_path: Path, block: dict, distributed: str) -> None:
    reference, two = one_and_parallel(tmp_path, block, **PLAIN_ROWS)
    out = tmp_path / "cp"
    done = torchrun(two, out, "--set", "train.parallel.cp=2", "--set", f"train.distributed={distributed}")
    assert "context parallel 2 ways: each process takes 2 of every row's 4 chunks (each group of 2" in done.stdout
    assert_same_run(out, reference)
