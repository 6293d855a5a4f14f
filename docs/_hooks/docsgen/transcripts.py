"""Real command output in the docs: ``<!-- specformer-output: summary specs/tiny.yaml -->``.

A page writes that comment on a line of its own; at build time it becomes a ``console``
block showing the command and what it printed (stdout and stderr, as a terminal shows
them) and its exit code when not 0. The command runs in-process from the repository
root, so what the page shows is what this version of specformer prints.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex

from docsgen.snippets import REPO

MARKER = re.compile(r"^(?P<indent>[ \t]*)<!-- specformer-output: (?P<args>.+?) -->[ \t]*$", re.MULTILINE)


def run_cli(args: str) -> tuple[int, str]:
    from specformer.cli import main

    buffer = io.StringIO()
    old = os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                code = main(shlex.split(args))
            except SystemExit as exc:  # argparse's --help and usage errors
                code = int(exc.code or 0)
    finally:
        os.chdir(old)
    return code, buffer.getvalue().rstrip()


def transcript(args: str) -> str:
    code, output = run_cli(args)
    lines = [f"$ specformer {args}", output] if output else [f"$ specformer {args}"]
    if code:
        lines += ["$ echo $?", str(code)]
    return "\n".join(lines)


def expand(markdown: str) -> tuple[str, list[tuple[str, int]]]:
    """The page with every marker replaced; and each command with its exit code."""
    ran: list[tuple[str, int]] = []

    def replace(match: re.Match[str]) -> str:
        indent, args = match["indent"], match["args"].strip()
        code, _ = run_cli(args)
        ran.append((args, code))
        block = ["```console", *transcript(args).splitlines(), "```"]
        return "\n".join(indent + line if line else line for line in block)

    return MARKER.sub(replace, markdown), ran
