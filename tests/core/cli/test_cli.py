"""The specformer command: exit codes, messages without tracebacks, and the listings."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types

import jsonschema
import pytest
import yaml

from specformer.cli.main import main
from specformer.registry import discovery
from specformer.registry.discovery import get_registry
from specformer.registry.hookspecs import hookimpl
from specformer.spec import read_spec_file

from conftest import SPECS

EXAMPLE_SPECS = sorted(p for p in SPECS.iterdir() if p.suffix in (".yaml", ".yml", ".json", ".toml"))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_ok(capsys):
    code, out, _ = run(capsys, "validate", str(SPECS / "tiny.yaml"), str(SPECS / "gpt2-124m.yaml"))
    assert code == 0
    assert out.count(": ok") == 2


def test_validate_bad_spec_exits_2_with_one_line_per_problem(capsys, tmp_path, fresh_tiny_spec):
    fresh_tiny_spec["model"]["block"]["mixer"]["n_kv_heads"] = 3
    fresh_tiny_spec["model"]["block"]["norm"] = "rmsnrom"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(fresh_tiny_spec))
    code, _, err = run(capsys, "validate", str(path))
    assert code == 2
    assert "2 problems" in err
    assert "model.block.mixer" in err and "model.block.norm.kind" in err
    assert "Traceback" not in err


@pytest.mark.slow  # subprocesses (4.5 s)
def test_user_mistakes_in_a_subprocess_give_exit_2_and_no_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "specformer.cli", "summary", str(tmp_path / "none.yaml")],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert "no such file" in result.stderr and "Traceback" not in result.stderr


def test_bad_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["validate", "--frobnicate"])
    assert info.value.code == 2


def test_summary_table_and_json(capsys):
    code, out, _ = run(capsys, "summary", str(SPECS / "gpt2-124m.yaml"))
    assert code == 0
    assert "124,439,808" in out and "non-embedding" in out and "KV cache / token" in out
    code, out, _ = run(capsys, "summary", "--json", str(SPECS / "gpt2-124m.yaml"))
    data = json.loads(out)
    assert data["total_params"] == 124_439_808
    # KV cache: 2 (k and v) * 12 layers * 768 channels * 4 bytes.
    assert data["kv_cache_bytes_per_token_fp32"] == 2 * 12 * 768 * 4


def test_summary_flops_by_formula(capsys):
    code, out, _ = run(capsys, "summary", "--json", str(SPECS / "gpt2-124m.yaml"))
    data = json.loads(out)
    n = data["non_embedding_params"] - (12 * 2 * 2 * 768 + 2 * 768)  # norms are no matmul
    n += 50257 * 768  # the tied LM head is one
    attention = 12 * 4 * 768 * 1024
    assert data["forward_flops_per_token"] == 2 * n + attention
    assert data["train_flops_per_token"] == 3 * (2 * n + attention)


def test_components_lists_kind_plugin_doc_and_defaults(capsys):
    code, out, _ = run(capsys, "components", "mixer")
    assert code == 0
    count = len(get_registry().names("mixer"))
    assert out.startswith(f"mixer ({count} component{'s' if count > 1 else ''})\n")
    assert re.search(r"^  attention +\[layers\] Scaled dot-product attention", out, re.M)
    assert re.search(r"^      n_heads +int > 0 +required +Number of query heads\.$", out, re.M)
    assert re.search(r"^      n_kv_heads +int > 0 or null +default null +Key/value heads", out, re.M)
    code, _, err = run(capsys, "components", "nonsense")
    assert code == 2 and "known kinds" in err


def test_components_json(capsys):
    code, out, _ = run(capsys, "components", "--json")
    entries = json.loads(out)
    assert {"kind": "norm", "name": "rmsnorm"}.items() <= next(e for e in entries if e["name"] == "rmsnorm").items()


def test_plugins_lists_where_they_came_from(capsys):
    code, out, _ = run(capsys, "plugins")
    assert code == 0
    assert "layers" in out and "specformer_layers.plugin" in out


def test_schema_validates_every_example_spec_and_rejects_a_bad_one(capsys, tmp_path):
    code, out, _ = run(capsys, "schema")
    schema = json.loads(out)
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for path in EXAMPLE_SPECS:
        errors = list(validator.iter_errors(read_spec_file(path)))
        assert not errors, (path.name, [e.message for e in errors])
    bad = read_spec_file(SPECS / "tiny.yaml")
    bad["model"]["block"]["mixer"]["n_haeds"] = 3
    assert list(validator.iter_errors(bad))
    bad = read_spec_file(SPECS / "tiny.yaml")
    bad["model"]["block"]["norm"] = "notanorm"
    assert list(validator.iter_errors(bad))


def test_schema_to_file(capsys, tmp_path):
    out = tmp_path / "schema.json"
    assert run(capsys, "schema", "-o", str(out))[0] == 0
    assert json.loads(out.read_text())["title"] == "specformer spec"


PROBE_RUN = """
def run(args):
    print(f"probe ran with {args.word}")
    return 3
"""


def _add_probe_command(run_path: str) -> None:
    def register(commands):
        commands.add("probe", help="A command of the test's own.",
                     configure=lambda p: p.add_argument("word"), run=run_path)

    plugin = types.SimpleNamespace(specformer_register_commands=hookimpl(register))
    discovery.register_plugin(discovery.get_plugin_manager(), plugin, name="probe_plugin")


def test_a_command_run_given_by_path_is_imported_only_when_it_runs(capsys, tmp_path, monkeypatch):
    (tmp_path / "sf_probe_command.py").write_text(PROBE_RUN, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    discovery.reset()
    try:
        _add_probe_command("sf_probe_command:run")
        with pytest.raises(SystemExit):
            main(["probe", "--help"])
        assert "A command of the test's own." in capsys.readouterr().out
        assert "sf_probe_command" not in sys.modules  # the parser was built without the run's module
        assert run(capsys, "probe", "hello")[:2] == (3, "probe ran with hello\n")
        assert "sf_probe_command" in sys.modules
    finally:
        sys.modules.pop("sf_probe_command", None)
        discovery.reset()


@pytest.mark.parametrize("path", ["sf_probe_command.run", "sf_probe_command:", "sf probe:run", "a:b:c"])
def test_a_malformed_run_path_is_refused_naming_the_plugin(capsys, path):
    discovery.reset()
    try:
        _add_probe_command(path)
        code, _, err = run(capsys, "validate", str(SPECS / "tiny.yaml"))
    finally:
        discovery.reset()
    assert code == 2
    assert f"plugin 'probe_plugin' adds command 'probe' with run={path!r}" in err
    assert "'package.module:function'" in err
