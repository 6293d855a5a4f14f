"""Bring the generated blocks of every docs page up to date (``make docs-refresh``).

``--check`` changes nothing and exits 1 naming the stale pages, for a pre-commit hook;
``tests/docs/test_generated_blocks.py`` makes the same check in the test suite. See
:mod:`docsgen.transcripts` for the markers. The commands run with specformer's built-in
plugins only, whatever else is installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docsgen.plugin_scope import builtin_only  # noqa: E402
from docsgen.transcripts import markdown_pages, refresh  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale pages (exit 1 if any)")
    args = parser.parse_args(argv)
    stale = []
    with builtin_only():  # once for all pages: each refresh alone would load the plugins anew
        for page in markdown_pages():
            text = page.read_text(encoding="utf-8")
            fresh = refresh(text)
            for command, code in fresh.ran:
                if code not in (0, 2):  # a transcript may show a refusal on purpose (exit 2), never a crash
                    print(f"{page}: `specformer {command}` exited with {code}", file=sys.stderr)
                    return 2
            if fresh.text != text:
                stale.append(page)
                if not args.check:
                    page.write_text(fresh.text, encoding="utf-8")
    verb = "stale" if args.check else "refreshed"
    for page in stale:
        print(f"{verb}: {page.relative_to(Path.cwd()) if page.is_relative_to(Path.cwd()) else page}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
