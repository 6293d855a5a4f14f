"""docs/architecture.md's map of the core names every module in it, in the row of its folder."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = REPO / "core" / "specformer"


def _rows() -> dict[str, str]:
    """Each row of the core's table: its first cell (a folder, or the root's files) -> the whole row."""
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    return {row.split("|")[1].strip(): row for row in page.splitlines() if row.startswith("| `")}


def test_every_core_module_is_on_the_map() -> None:
    rows = _rows()
    root_row = next((row for first, row in rows.items() if "`errors.py`" in first), "")
    missing = []
    for module in sorted(CORE.rglob("*.py")):
        if module.name in ("__init__.py", "__main__.py") or "__pycache__" in module.parts:
            continue
        folder = module.parent.relative_to(CORE).as_posix()
        row = root_row if folder == "." else rows.get(f"`{folder}/`", "")
        if not re.search(rf"`{re.escape(module.name)}`", row):
            missing.append(module.relative_to(CORE).as_posix())
    assert missing == [], f"docs/architecture.md's core table does not name {missing} in its folder's row"


def test_the_map_names_no_module_that_is_gone() -> None:
    for first, row in _rows().items():
        folder = CORE if not first.endswith("/`") else CORE / first.strip("`")
        if not folder.is_dir():
            continue
        named = set(re.findall(r"`([a-z_]+\.py)`", row))
        gone = sorted(name for name in named if not (folder / name).exists())
        assert gone == [], f"docs/architecture.md's row {first} names modules that do not exist: {gone}"
