"""The command under hostile conditions: closed pipes, Ctrl-C, unreadable files, untrusted specs."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import specformer.cli.main as cli
from specformer.cli.main import main
from specformer.machine.memory import ENV_VAR

from conftest import SPECS, TINY


@pytest.mark.slow
def test_summary_into_a_closed_pipe_exits_quietly():
    """``specformer summary spec | head -0``: the reader is gone before the first write."""
    proc = subprocess.Popen([sys.executable, "-m", "specformer.cli", "summary", str(SPECS / "tiny.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141, err.decode()
    assert err.decode() == ""


def test_a_broken_pipe_inside_a_command_is_not_a_traceback(monkeypatch, capsys):
    def closed(_args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "_run_plugins", closed)
    assert main(["plugins"]) == 141
    assert capsys.readouterr().err == ""


def test_a_pipe_closed_before_the_final_flush_is_caught_in_main(monkeypatch):
    """Buffered output reaches a closed pipe only when flushed: main flushes while it can still handle it."""

    class ClosedPipe:
        def write(self, text):
            return len(text)

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", ClosedPipe())
    assert main(["summary", str(SPECS / "tiny.yaml")]) == 141


@pytest.mark.parametrize("where", ["make_parser", "_run_validate"])
def test_ctrl_c_during_start_up_or_a_command_is_one_line_and_130(monkeypatch, capsys, where):
    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, where, interrupted)
    assert main(["validate", str(SPECS / "tiny.yaml")]) == 130
    err = capsys.readouterr().err
    assert err == "specformer: interrupted\n"


@pytest.mark.slow
def test_ctrl_c_in_a_real_process_during_plugin_loading():
    """SIGINT while the command is starting (its plugins loading): exit 130, one line, no traceback."""
    code = (
        "import signal, os, specformer.registry.discovery as p\n"
        "orig = p.get_plugin_manager\n"
        "def slow():\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    return orig()\n"
        "p.get_plugin_manager = slow\n"
        "import sys\n"
        "from specformer.cli.main import main\n"
        "sys.exit(main(['plugins']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 130, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip() == "specformer: interrupted"


def test_writing_into_a_missing_folder_is_one_line(tmp_path, capsys):
    code = main(["schema", "-o", str(tmp_path / "no" / "such" / "dir" / "schema.json")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"the folder {tmp_path / 'no' / 'such' / 'dir'} does not exist" in err


def test_validate_refuses_untrusted_specs_with_exit_2(tmp_path, capsys):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text('a: &a ["x","x","x","x","x","x","x","x","x"]\n'
                    + "".join(f'{c}: &{c} [{", ".join([f"*{p}"] * 9)}]\n' for p, c in zip("abcdefgh", "bcdefghi"))
                    + "model: {vocab_size: *i}\n")
    nul = tmp_path / "latin.json"
    nul.write_bytes(b'{"model": "\xff"}')
    code = main(["validate", str(bomb), str(nul), str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert "aliases" in err and "not UTF-8" in err and "is a directory" in err
    assert "Traceback" not in err and len(err) < 2000


def test_max_memory_flag_sets_the_limit_for_the_run(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(ENV_VAR, raising=False)
    spec = tmp_path / "tiny.json"
    spec.write_text(json.dumps(TINY))
    assert main(["--max-memory", "1.5G", "validate", str(spec)]) == 0
    assert os.environ[ENV_VAR] == "1.5G"
    assert main(["--max-memory", "lots", "validate", str(spec)]) == 2
    assert "is not a size" in capsys.readouterr().err
