"""Loggers are components of the ``logger`` kind, chosen by ``train.loggers``; the trainer names none."""

from __future__ import annotations

import csv
import textwrap
from pathlib import Path

import pytest

from fixtures.isolated_plugin import stage
from specformer.errors import UserError
from specformer.registry.discovery import get_plugin_manager, get_registry
from specformer_train import train
from specformer_train.config import TrainSpec
from specformer_train.metrics import read_metrics

from .conftest import tiny_train_spec

# A third-party plugin with one logger: every step's loss as a CSV row, and how the run ended.
CSV_PLUGIN = {
    "pyproject.toml": """
        [project]
        name = "specformer-csvlog"
        version = "0.1.0"

        [project.entry-points.specformer]
        csvlog = "specformer_csvlog.plugin"

        [tool.setuptools]
        packages = ["specformer_csvlog"]
    """,
    "specformer_csvlog/__init__.py": "",
    "specformer_csvlog/plugin.py": '''
        from pathlib import Path

        from pydantic import Field

        from specformer.registry.hookspecs import hookimpl
        from specformer.registry.params import Params


        class CsvParams(Params):
            file: str = Field(default="losses.csv", description="File name in the run directory.")


        class CsvLogger:
            """Each step's loss as a CSV row."""

            def __init__(self, path):
                self.file = open(path, "a", encoding="utf-8")

            @hookimpl
            def specformer_on_train_step(self, step, metrics):
                self.file.write(f"{step},{metrics['loss']!r}\\n")

            def close(self, status):
                self.file.write(f"end,{status}\\n")
                self.file.close()


        def make_csv_logger(params, *, out_dir):
            return CsvLogger(Path(out_dir) / params.file)


        @hookimpl
        def specformer_register_components(registry):
            registry.register("logger", "csv", factory=make_csv_logger, params=CsvParams)
    ''',
}


def test_default_loggers_are_jsonl_and_tensorboard() -> None:
    config = TrainSpec()
    assert [r.component.name for r in config.loggers] == ["jsonl", "tensorboard"]
    assert {"jsonl", "tensorboard"} <= set(get_registry().names("logger"))


def test_without_the_jsonl_logger_no_metrics_file_is_written(tmp_path: Path, corpus_dir: Path) -> None:
    out = tmp_path / "run"
    result = train(tiny_train_spec(data=str(corpus_dir), out_dir=str(out), steps=2, eval_every=0, save_every=0,
                                   loggers=[], plot=True))
    assert result.status == "finished"
    assert not (out / "metrics.jsonl").exists() and not (out / "loss.png").exists()


def test_an_unknown_logger_names_the_registered_ones() -> None:
    with pytest.raises(Exception) as info:
        TrainSpec(loggers=["jsonl", "wandb_typo"])
    message = str(info.value)
    assert "wandb_typo" in message and "jsonl" in message and "tensorboard" in message


def test_a_third_party_logger_is_a_plugin(tmp_path: Path, corpus_dir: Path) -> None:
    project = tmp_path / "csvlog"
    for name, text in CSV_PLUGIN.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    plugins_before = {name for name, _ in get_plugin_manager().list_name_plugin()}
    with stage(project, tmp_path / "site").active():
        out = tmp_path / "run"
        train(tiny_train_spec(data=str(corpus_dir), out_dir=str(out), steps=3, eval_every=0, save_every=0,
                              loggers=["jsonl", {"kind": "csv", "file": "curve.csv"}]))
        rows = list(csv.reader((out / "curve.csv").read_text(encoding="utf-8").splitlines()))
        # The same losses as the jsonl logger saw, in order, then the ending the trainer reported.
        jsonl = [(r["step"], r["loss"]) for r in read_metrics(out / "metrics.jsonl") if r["kind"] == "train"]
        assert [(int(s), float(v)) for s, v in rows[:-1]] == jsonl and len(jsonl) == 3
        assert rows[-1] == ["end", "finished"]
        plugin_names = {name for name, _ in get_plugin_manager().list_name_plugin()}
    assert plugin_names - plugins_before == {"csvlog"}, "the run's logger instances were unregistered at its end"


def test_a_logger_that_fails_to_start_leaves_nothing_registered(tmp_path: Path, corpus_dir: Path) -> None:
    blocked = tmp_path / "run"
    blocked.mkdir()
    (blocked / "metrics.jsonl").mkdir()  # the jsonl logger cannot open its file
    plugins_before = {name for name, _ in get_plugin_manager().list_name_plugin()}
    with pytest.raises(UserError, match="metrics.jsonl"):
        train(tiny_train_spec(data=str(corpus_dir), out_dir=str(blocked), steps=2, loggers=["tensorboard", "jsonl"],
                              tensorboard=True))
    assert {name for name, _ in get_plugin_manager().list_name_plugin()} == plugins_before
