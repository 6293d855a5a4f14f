"""The hooks reference, read from ``specformer.registry.hookspecs`` and the loaded plugin manager."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from specformer.registry import hookspecs
from specformer.registry.discovery import get_plugin_manager, plugin_infos

from docsgen.text import cell, first_sentence, rst_to_md


@dataclass
class HookDoc:
    name: str
    function: Callable[..., Any]
    options: dict[str, Any]
    implemented_by: list[str]


def hooks(module: Any = hookspecs) -> list[HookDoc]:
    """Every hookspec of ``module`` in source order, with who implements it among the loaded plugins."""
    pm = get_plugin_manager()
    found = []
    for name, function in vars(module).items():
        options = getattr(function, f"{hookspecs.PROJECT}_spec", None)
        if options is None or not callable(function) or getattr(function, "__module__", None) != module.__name__:
            continue
        caller = getattr(pm.hook, name, None)
        impls = [i.plugin_name for i in caller.get_hookimpls()] if caller is not None else []
        found.append(HookDoc(name, function, dict(options), sorted(set(impls))))
    found.sort(key=lambda h: inspect.getsourcelines(h.function)[1])
    return found


def plugin_hooks() -> list[tuple[str, Any, list[HookDoc]]]:
    """Hooks that plugins define for other plugins, by convention in ``<their package>.hookspecs``."""
    out = []
    for info in plugin_infos():
        package = info.module.split(".")[0]
        name = f"{package}.hookspecs"
        if package == "specformer" or importlib.util.find_spec(package) is None or importlib.util.find_spec(name) is None:
            continue
        module = importlib.import_module(name)
        found = hooks(module)
        if found:
            out.append((info.name, module, found))
    return out


def _annotation(param: inspect.Parameter) -> str:
    a = param.annotation
    if a is inspect.Parameter.empty:
        return "any"
    # Annotations are strings under ``from __future__ import annotations``, some quoted twice.
    return a.strip("'\"") if isinstance(a, str) else getattr(a, "__name__", str(a))


def _signature(h: HookDoc) -> str:
    sig = inspect.signature(h.function)
    params = ", ".join(f"{p.name}: {_annotation(p)}" for p in sig.parameters.values())
    ret = sig.return_annotation
    ret_name = ret.strip("'\"") if isinstance(ret, str) else getattr(ret, "__name__", ret)
    ret_text = "" if ret is inspect.Signature.empty else f" -> {ret_name}"
    return f"@hookimpl\ndef {h.name}({params}){ret_text}:\n    ..."


def _result(h: HookDoc) -> str:
    if h.options.get("firstresult"):
        return ("**firstresult: yes.** Implementations are called until one returns something other than "
                "`None`; that value is the result and the remaining implementations are skipped.")
    returns = inspect.signature(h.function).return_annotation
    if returns in (None, "None", inspect.Signature.empty):
        return "**firstresult: no.** Every implementation is called; return values are ignored."
    return ("**firstresult: no.** Every implementation is called; the caller receives the list of their "
            "non-`None` return values.")


def hooks_page() -> str:
    all_hooks = hooks()
    lines = [
        "# Hooks reference",
        "",
        "A plugin is a module with functions named like the hooks below, each decorated with "
        "`specformer.hookimpl`, and declared under the `specformer` entry-point group of its package "
        "(see [Writing a plugin](../writing-a-plugin.md)). Implement only the hooks you need; an "
        "implementation may accept a subset of the parameters (pluggy passes them by name).",
        "",
        "Callers call them through the plugin manager, always with keyword arguments:",
        "",
        "```python",
        "from specformer.registry.discovery import get_plugin_manager, plugin_infos",
        "",
        "get_plugin_manager().hook.specformer_on_train_step(step=100, metrics={\"loss\": 2.1})",
        "```",
        "",
        "This page is generated from `specformer/registry/hookspecs.py`; *implemented by* lists the plugins "
        "loaded when the site was built.",
        "",
        "| Hook | When it is called | firstresult |",
        "| --- | --- | --- |",
    ]
    for h in all_hooks:
        lines.append(
            f"| [`{h.name}`](#{h.name}) | {cell(rst_to_md(first_sentence(h.function.__doc__ or ''), module='specformer.registry.hookspecs'))} "
            f"| {'yes' if h.options.get('firstresult') else 'no'} |"
        )
    extra = plugin_hooks()
    for plugin, module, found in extra:
        for h in found:
            lines.append(
                f"| [`{h.name}`](#{h.name}) | {cell(rst_to_md(first_sentence(h.function.__doc__ or ''), module=module.__name__))} "
                f"(plugin `{plugin}`) | {'yes' if h.options.get('firstresult') else 'no'} |"
            )
    lines.append("")
    for h in all_hooks:
        lines += _hook_section(h, "specformer.registry.hookspecs", level=2)
    for plugin, module, found in extra:
        lines += [
            f"## Hooks of plugin `{plugin}` {{ #plugin-{plugin} }}",
            "",
            rst_to_md(module.__doc__ or "", module=module.__name__),
            "",
        ]
        for h in found:
            lines += _hook_section(h, module.__name__, level=3)
    return "\n".join(lines)


def _hook_section(h: HookDoc, module: str, *, level: int) -> list[str]:
    lines = [
        f"{'#' * level} {h.name} {{ #{h.name} }}",
        "",
        "```python",
        _signature(h),
        "```",
        "",
        rst_to_md(h.function.__doc__ or "", module=module),
        "",
        "| Parameter | Type |",
        "| --- | --- |",
    ]
    for p in inspect.signature(h.function).parameters.values():
        lines.append(f"| `{p.name}` | `{cell(_annotation(p))}` |")
    historic = " **historic**: plugins registered later still receive earlier calls." if h.options.get("historic") else ""
    implemented = ", ".join(f"`{p}`" for p in h.implemented_by) if h.implemented_by else "_no loaded plugin_"
    return lines + ["", _result(h) + historic, "", f"Implemented by: {implemented}.", ""]
