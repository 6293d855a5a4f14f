"""``specformer dyt-swap``: through the real command line, as a user runs it."""

from __future__ import annotations

import subprocess
import sys

import specformer
import yaml

SPEC = """\
model:
  vocab_size: 64
  d_model: 32
  n_layers: 2
  context_length: 16
  positional: rope
  block: {norm: rmsnorm, mixer: {kind: attention, n_heads: 4}, ffn: swiglu}
  final_norm: {kind: rmsnorm, eps: 1.0e-5}
"""


def specformer_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specformer.cli", *args], capture_output=True, text=True)


def test_swaps_every_norm(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text(SPEC)
    result = specformer_cli("dyt-swap", str(path), "--alpha-init", "0.6")
    assert result.returncode == 0, result.stderr
    data = yaml.safe_load(result.stdout)
    assert data["model"]["block"]["norm"] == {"kind": "dyt", "alpha_init": 0.6}
    assert data["model"]["final_norm"] == {"kind": "dyt", "alpha_init": 0.6}
    specformer.load_spec(data)


def test_bad_input_is_one_message_and_exit_2(tmp_path):
    result = specformer_cli("dyt-swap", str(tmp_path / "missing.yaml"))
    assert result.returncode == 2
    assert "no such file" in result.stderr and "Traceback" not in result.stderr
    path = tmp_path / "model.yaml"
    path.write_text(SPEC)
    result = specformer_cli("dyt-swap", str(path), "--alpha-init", "-1")
    assert result.returncode == 2 and "--alpha-init must be > 0" in result.stderr
