"""Python API pages: one per module of the ``specformer`` package, rendered by mkdocstrings."""

from __future__ import annotations

from pathlib import Path

import specformer

from docsgen.text import cell, first_sentence, rst_to_md


CORE = Path(specformer.__file__).parent


def api_modules() -> list[str]:
    """Every public module and subpackage of the core, e.g. ``specformer.registry.components`` (read from the files)."""
    names = set()
    for path in CORE.rglob("*.py"):
        parts = path.relative_to(CORE).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if parts and not any(part.startswith("_") for part in parts):
            names.add("specformer." + ".".join(parts))
    return sorted(names)


def api_page_path(module: str) -> str:
    """``specformer.model.masks`` -> ``api/model/masks.md``; a package's own page is its ``index.md``."""
    relative = module.removeprefix("specformer.").replace(".", "/")
    return f"api/{relative}/index.md" if (CORE / relative).is_dir() else f"api/{relative}.md"


def api_pages() -> dict[str, str]:
    pages: dict[str, str] = {}
    rows = ["| Name | What it is | Defined in |", "| --- | --- | --- |"]
    for name in specformer.__all__:
        obj = getattr(specformer, name)
        module = getattr(obj, "__module__", None)
        if not (isinstance(module, str) and module.startswith("specformer.") and hasattr(obj, "__doc__") and not isinstance(obj, str)):
            continue
        target = f"{module}.{getattr(obj, '__qualname__', name)}"
        summary = first_sentence(getattr(obj, "__doc__", "") or "")
        rows.append(f"| [`specformer.{name}`][{target}] | {cell(rst_to_md(summary, module=module))} | "
                    f"[`{module}`]({api_page_path(module).removeprefix('api/')}) |")
    pages["api/index.md"] = "\n".join([
        "# Python API",
        "",
        "Everything below is importable from the top-level `specformer` package. The pages that follow "
        "document each module of the core in full; they are generated from the docstrings.",
        "",
        "::: specformer",
        "    options:",
        "      members: false",
        "      show_root_heading: false",
        "",
        *rows,
        "",
        "## Modules",
        "",
        *[f"- [`{m}`]({api_page_path(m).removeprefix('api/')}): {rst_to_md(first_sentence(_module_doc(m)), module=m)}" for m in api_modules()],
        "",
    ])
    for module in api_modules():
        pages[api_page_path(module)] = f"# `{module}`\n\n::: {module}\n"
    return pages


def _module_doc(module: str) -> str:
    import importlib

    return importlib.import_module(module).__doc__ or ""
