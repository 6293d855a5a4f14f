"""A wrong recurrent-mixer spec is refused by ``specformer validate`` with one problem naming what is accepted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.tiny import tiny_spec
from specformer.cli.main import main

#: (the mixer as written, the one problem validate prints for it)
BAD: dict[str, tuple[dict[str, Any], str]] = {
    "conv kernel 0": ({"kind": "gated_deltanet", "n_heads": 4, "conv_kernel": 0},
                      "model.block.mixer.conv_kernel: conv_kernel must be at least 2"),
    "a window on a recurrence": ({"kind": "gated_deltanet", "n_heads": 4, "window": 16},
                                 "model.block.mixer.window: unknown field; accepted: n_heads, n_key_heads"),
    "value heads not a multiple of key heads": ({"kind": "gated_deltanet", "n_heads": 3, "n_key_heads": 2,
                                                 "key_head_dim": 8},
                                                "model.block.mixer: n_key_heads (2) must divide n_heads (3)"),
    "heads not a multiple of the groups": ({"kind": "mamba2", "n_heads": 4, "head_dim": 8, "n_groups": 3},
                                           "model.block.mixer: n_groups (3) must divide n_heads (4)"),
    "mamba2 conv kernel 0": ({"kind": "mamba2", "n_heads": 4, "head_dim": 8, "conv_kernel": 0},
                             "model.block.mixer.conv_kernel: conv_kernel must be at least 2"),
    "short_conv kernel 1": ({"kind": "short_conv", "kernel": 1},
                            "model.block.mixer.kernel: kernel must be at least 2"),
    "kda conv kernel 0": ({"kind": "kda", "n_heads": 4, "conv_kernel": 0},
                          "model.block.mixer.conv_kernel: conv_kernel must be at least 2"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_mixer_is_one_problem(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mixer, problem = BAD[case]
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(tiny_spec(block={"mixer": mixer})))
    assert main(["validate", str(path)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == f"{path}: 1 problem in the spec:", lines
    # The last line may name the checks these problems held back; it is not a problem.
    problems = [line for line in lines[1:] if not line.strip().startswith("(checked once these are fixed")]
    assert len(problems) == 1 and problems[0].strip().startswith(problem), lines
