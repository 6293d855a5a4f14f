"""Names specformer has changed, read the old way: every spec and checkpoint written before keeps loading.

The block's token mixer was once called ``attention``, though it holds every token mixer
(Mamba-2, Gated DeltaNet, a short convolution, none), so specs wrote
``block: {attention: {kind: mamba2}}`` and its tensors were ``blocks.{i}.attention.*``.
It is now ``mixer``: the spec key (in ``model.block`` and every ``model.layers[]``
entry), the component kind and the module attribute (``blocks.{i}.mixer.*``). What
was written before is read here, in one place each:

- :func:`upgrade_spec`: a spec's old ``attention:`` key read as ``mixer:``, with one
  deprecation line per file (both keys in one place: an error naming both);
- :func:`current_kind`: a component kind named before (a checkpoint's component sources, a plugin's registration);
- :func:`current_name`: a tensor or module path stored before (a checkpoint's tensors, an
  adapter's targets, a quantization recipe, an optimizer's parameter names) as it is now;
- :func:`current_patterns`: a user's globs over module paths (``blocks.*.attention.qkv``),
  with the same deprecation line;
- :func:`sizes_for`: a third-party layout whose constructor (or size check) still takes
  ``attention=`` is handed the mixer under that name, with the same deprecation line.

The norms and residual connections around the mixer keep their names
(``attention_norm``, ``attention_residual``): those tensors did not move.
"""

from __future__ import annotations

import warnings
from typing import Any

from specformer.errors import Problem, SpecError
from specformer.messages import join_path

#: The block's token mixer, as specs, the registry and module paths name it.
MIXER = "mixer"
#: What it was called before (read, never written).
OLD_MIXER = "attention"


class RenamedWarning(DeprecationWarning):
    """A name written the old way was read the new way: rewrite it, it will stop being read some day."""


# Shown, where DeprecationWarning is hidden by default: the person who wrote the file is the one to tell.
warnings.filterwarnings("always", category=RenamedWarning)

#: The lines said in this process: each once, however often its file is read (a command may validate a spec twice).
_SAID: set[str] = set()


def _say(where: str, subject: str) -> None:
    line = (f"{where}: {subject}: the block's token mixer is now called {MIXER!r} (whatever its kind); "
            f"{OLD_MIXER!r} is read as {MIXER!r} for now: rename it")
    if line not in _SAID:
        _SAID.add(line)
        warnings.warn(line, RenamedWarning, stacklevel=3)


def forget_said() -> None:
    """Say every line again when its file is next read (tests, each of which reads files anew)."""
    _SAID.clear()


def upgrade_spec(data: Any, *, source: str | None = None) -> Any:
    """``data`` with each block's ``attention:`` key read as ``mixer:`` (a copy; ``data`` itself is left alone).

    One :class:`RenamedWarning` names the file (``source``) and the new key, whatever the
    number of layers written the old way. A place with both keys is a :class:`SpecError`
    naming both. Anything that is not a spec's shape is returned as it is, for validation
    to report.
    """
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, dict):
        return data
    places: list[tuple[str, dict[str, Any]]] = []
    if isinstance(model.get("block"), dict):
        places.append((join_path("model", ["block"]), model["block"]))
    layers = model.get("layers")
    if isinstance(layers, list):
        places += [(join_path("model", ["layers", j]), entry) for j, entry in enumerate(layers) if isinstance(entry, dict)]
    old = [(path, entry) for path, entry in places if OLD_MIXER in entry]
    if not old:
        return data
    both = [Problem(path, f"both {OLD_MIXER!r} and {MIXER!r}: they are one key ({OLD_MIXER!r} is its old name); keep "
                          f"{MIXER!r} alone") for path, entry in old if MIXER in entry]
    if both:
        raise SpecError(both, source=source)
    renamed = {id(entry): _renamed(entry) for _, entry in old}
    model = dict(model)
    if id(model.get("block")) in renamed:
        model["block"] = renamed[id(model["block"])]
    if isinstance(layers, list):
        model["layers"] = [renamed.get(id(entry), entry) for entry in layers]
    more = f" (and {len(old) - 1} more)" if len(old) > 1 else ""
    _say(source or "a spec", f"{old[0][0]}.{OLD_MIXER}{more}")
    return {**data, "model": model}


def _renamed(entry: dict[str, Any]) -> dict[str, Any]:
    """The mapping with its old key renamed in place (the key order kept: problems are reported in file order)."""
    return {(MIXER if key == OLD_MIXER else key): value for key, value in entry.items()}


def current_kind(kind: str, *, where: str | None = None) -> str:
    """A component kind named before the rename (a checkpoint's component sources, a plugin registering an
    ``attention``), as it is now; with ``where`` (who named it), one line says so."""
    if kind != OLD_MIXER:
        return kind
    if where is not None:
        _say(where, f"kind {OLD_MIXER!r}")
    return MIXER


def current_name(name: str) -> str:
    """A dotted module or tensor path of a model stored before the rename, as it is now.

    ``blocks.3.attention.qkv.weight`` is ``blocks.3.mixer.qkv.weight``; a path without
    the old segment is returned unchanged (no module of a model has a part called
    ``attention`` any more, so only old names change).
    """
    if OLD_MIXER not in name:
        return name
    return ".".join(MIXER if part == OLD_MIXER else part for part in name.split("."))


def sizes_for(sizes: dict[str, Any], accepted: set[str] | None, *, where: str) -> dict[str, Any]:
    """The sizes a component is given, for one written before the rename: a layout (or its size check)
    whose constructor takes ``attention=`` and no ``mixer=`` receives the mixer under its old name.

    ``accepted``: the keyword names the factory takes (None: it takes ``**``, and gets the new
    name). ``where`` names the factory in the one line that says so.
    """
    if accepted is None or MIXER not in sizes or MIXER in accepted or OLD_MIXER not in accepted:
        return sizes
    _say(where, f"its {OLD_MIXER}= argument")
    return {(OLD_MIXER if key == MIXER else key): value for key, value in sizes.items()}


def current_patterns(patterns: list[str], *, where: str) -> list[str]:
    """A user's globs over module paths (``blocks.*.attention.qkv``) as they are now, with one line saying so.

    ``where`` names the setting the patterns came from (``lora targets``); the line names it
    and the first old pattern, once for the whole list.
    """
    current = [current_name(p) for p in patterns]
    old = [p for p, c in zip(patterns, current) if p != c]
    if old:
        _say(where, f"{old[0]!r} is read as {current_name(old[0])!r}")
    return current


__all__ = ["MIXER", "OLD_MIXER", "RenamedWarning", "current_kind", "current_name", "current_patterns", "forget_said",
           "sizes_for", "upgrade_spec"]
