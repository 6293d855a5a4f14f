"""The CLI reference, read from the argparse parser the ``specformer`` command builds."""

from __future__ import annotations

import argparse
import os
from contextlib import contextmanager
from typing import Iterator

from specformer.cli.main import make_parser

from docsgen.text import cell

WIDTH = "96"


@contextmanager
def _columns() -> Iterator[None]:
    """argparse wraps usage to the terminal width; make it the same on every machine."""
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| Argument | Meaning | Default |", "| --- | --- | --- |"]
    count = 0
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar or action.dest.upper()
                name += f" {metavar if isinstance(metavar, str) else ' '.join(metavar)}"
        else:
            name = action.metavar if isinstance(action.metavar, str) else action.dest
            if action.nargs in ("+", "*"):
                name += " ..."
            if action.nargs in ("?", "*"):
                name = f"[{name}]"
        text = action.help or ""
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            text += " (one of: " + ", ".join(f"`{c}`" for c in action.choices) + ")"
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or isinstance(action, argparse._VersionAction) else f"`{default}`"
        if action.required and action.option_strings:
            shown = "**required**"
        rows.append(f"| `{cell(name)}` | {cell(text)} | {cell(shown)} |")
        count += 1
    return rows if count else ["_No arguments._"]


def _command_section(name: str, parser: argparse.ArgumentParser, plugin: str, level: int) -> list[str]:
    head = "#" * level
    with _columns():
        usage = parser.format_usage().strip()
    lines = [
        f"{head} {name} {{ #{name.replace(' ', '-')} }}",
        "",
        f'<p class="sf-meta">added by plugin <strong><code>{plugin}</code></strong></p>',
        "",
        parser.description or "",
        "",
        "```text",
        usage,
        "```",
        "",
        *_arguments_table(parser),
        "",
    ]
    for sub_name, sub in _subparsers(parser).items():
        lines += _command_section(f"{name} {sub_name}", sub, plugin, level + 1)
    return lines


def cli_page() -> str:
    parser, commands = make_parser()
    with _columns():
        usage = parser.format_usage().strip()
    subs = _subparsers(parser)
    lines = [
        "# CLI reference",
        "",
        "Generated from the `specformer` command's own parser: the core's commands and those every "
        "plugin loaded at build time adds through `specformer_register_commands`. A user's mistake "
        "(a bad spec, flag or file) prints one message and exits with code 2; `--help` on any command "
        "prints what this page shows.",
        "",
        "```text",
        usage,
        "```",
        "",
        "| Command | Plugin | What it does |",
        "| --- | --- | --- |",
    ]
    for name in subs:
        command = commands.by_name[name]
        lines.append(f"| [`{name}`](#{name}) | `{command.plugin}` | {cell(command.help)} |")
    lines.append("")
    for name, sub in subs.items():
        lines += _command_section(name, sub, commands.by_name[name].plugin, 2)
    return "\n".join(lines)
