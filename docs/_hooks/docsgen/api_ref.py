"""Python API pages: one per module of the ``specformer`` package, rendered by mkdocstrings."""

from __future__ import annotations

import pkgutil

import specformer

from docsgen.text import cell, first_sentence, rst_to_md


def api_modules() -> list[str]:
    """Every public module of the core package, e.g. ``specformer.registry.components``."""
    return sorted(
        f"specformer.{m.name}" for m in pkgutil.iter_modules(specformer.__path__) if not m.name.startswith("_")
    )


def api_page_path(module: str) -> str:
    return f"api/{module.rsplit('.', 1)[-1]}.md"


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
