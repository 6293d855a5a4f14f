"""docs/interop.md's worked example runs and says what the page says it says."""

from __future__ import annotations

import runpy
from pathlib import Path


def test_worked_example(capsys):
    runpy.run_path(str(Path(__file__).with_name("example_interop.py")), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "{'kind': 'attention', 'n_heads': 4, 'n_kv_heads': 2, 'head_dim': 16, 'qkv_bias': False, 'out_bias': False}"
    assert out[1].startswith("largest logit difference: ") and float(out[1].split(": ")[1]) <= 1e-4
    assert out[2].startswith("exported as MistralForCausalLM, largest logit difference: ")
    assert float(out[2].rsplit(": ", 1)[1]) <= 1e-4
