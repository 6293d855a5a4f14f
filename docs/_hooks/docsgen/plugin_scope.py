"""Which plugins the docs document: specformer's built-in ones, unless asked for every installed one.

The docs are specformer's documentation. A plugin that happens to be installed where they
are made (a test fixture, the tutorial's package, your own work in progress) must not appear
in the site's component catalogue, its hook and CLI references, or the command output kept
in the pages (``make docs-refresh``). Both read specformer's one cached plugin manager, whose
plugins ``SPECFORMER_PLUGINS`` selects (:mod:`specformer.registry.discovery`).

The site's scope is set in ``mkdocs.yml`` (``extra.specformer_plugins``), which reads the
environment variable ``SPECFORMER_DOCS_PLUGINS``:

- ``builtin`` (the default): the entry points of the ``specformer`` distribution only;
- ``installed``: every plugin installed in the environment, e.g. to preview how your own
  plugin's components render: ``SPECFORMER_DOCS_PLUGINS=installed mkdocs serve``.

The command output in the pages is always made with the built-in plugins (:func:`builtin_only`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from specformer.registry import discovery

SCOPES = ("builtin", "installed")
#: The distribution whose entry points are the built-in plugins.
BUILTIN_DISTRIBUTION = discovery.BUILTIN_DISTRIBUTION


def load_plugins(scope: str) -> list[str]:
    """Load the plugins of ``scope`` into specformer's plugin manager and registry, for the rest
    of this process (``SPECFORMER_PLUGINS`` is set to match); their names.

    Everything that documents plugins (the generators, the transcripts run in-process) reads
    the one cached plugin manager, so choosing the plugins once here scopes the whole build.
    """
    if scope not in SCOPES:
        raise ValueError(f"specformer_plugins / SPECFORMER_DOCS_PLUGINS is {scope!r}; accepted: {', '.join(SCOPES)}")
    os.environ[discovery.PLUGINS_VARIABLE] = scope
    discovery.reset()
    discovery.get_registry()
    return [info.name for info in discovery.plugin_infos()]


@contextmanager
def builtin_only() -> Iterator[None]:
    """The built-in plugins only inside the block (commands run in-process and subprocesses started
    in it included), the plugins selected before it after; reloads the plugins only when that changes."""
    before = os.environ.get(discovery.PLUGINS_VARIABLE)
    if before == "builtin":
        yield
        return
    os.environ[discovery.PLUGINS_VARIABLE] = "builtin"
    discovery.reset()
    try:
        yield
    finally:
        if before is None:
            del os.environ[discovery.PLUGINS_VARIABLE]
        else:
            os.environ[discovery.PLUGINS_VARIABLE] = before
        discovery.reset()
