"""Which plugins the site documents: specformer's built-in ones, unless asked for every installed one.

The site is specformer's documentation. A plugin that happens to be installed where mkdocs
runs (a test fixture, the tutorial's package, your own work in progress) must not appear in
its component catalogue, its hook and CLI references or its command transcripts. The scope
is set in ``mkdocs.yml`` (``extra.specformer_plugins``), which reads the environment
variable ``SPECFORMER_DOCS_PLUGINS``:

- ``builtin`` (the default): the entry points of the ``specformer`` distribution only;
- ``installed``: every plugin installed in the environment, e.g. to preview how your own
  plugin's components render: ``SPECFORMER_DOCS_PLUGINS=installed mkdocs serve``.
"""

from __future__ import annotations

import importlib.metadata

from specformer.registry import discovery as plugins

SCOPES = ("builtin", "installed")
#: The distribution whose entry points are the built-in plugins.
BUILTIN_DISTRIBUTION = "specformer"


def load_plugins(scope: str) -> list[str]:
    """Load the plugins of ``scope`` into specformer's plugin manager and registry; their names.

    Everything that documents plugins (the generators, the transcripts run in-process) reads
    the one cached plugin manager, so choosing the plugins once here scopes the whole build.
    """
    if scope not in SCOPES:
        raise ValueError(f"specformer_plugins / SPECFORMER_DOCS_PLUGINS is {scope!r}; accepted: {', '.join(SCOPES)}")
    plugins.reset()
    if scope == "installed":
        plugins.get_registry()
        return [info.name for info in plugins.plugin_infos()]
    # The plugin manager reads importlib.metadata.entry_points once, when first built: narrow what
    # that one call sees, then restore it before anything else (mkdocs included) looks.
    real = importlib.metadata.entry_points

    def builtin_entry_points(**selection):
        found = real(**selection)
        if selection.get("group") != plugins.ENTRY_POINT_GROUP:
            return found
        return [ep for ep in found if ep.dist is not None and ep.dist.name == BUILTIN_DISTRIBUTION]

    importlib.metadata.entry_points = builtin_entry_points
    try:
        plugins.get_registry()
    finally:
        importlib.metadata.entry_points = real
    return [info.name for info in plugins.plugin_infos()]
