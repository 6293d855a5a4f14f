"""mkdocs hook: generate the pages read from the code, and fit the navigation to what exists.

Generated at build time from the live registry, hookspecs and CLI (nothing is written to
docs/): the component catalogue, the spec, hooks and CLI references, and one Python API
page per module. Command output and included files are kept in the pages themselves
(``docsgen.transcripts``; ``make docs-refresh`` regenerates them), so a page reads the same
in an editor as on the site. Pages written alongside features are listed in
``mkdocs.yml`` and left out of the navigation while they do not exist (``OPTIONAL_PAGES``).
The plugins documented are the built-in ones unless ``extra.specformer_plugins`` in
``mkdocs.yml`` (``SPECFORMER_DOCS_PLUGINS``) says ``installed`` (``docsgen.plugin_scope``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from mkdocs.exceptions import ConfigurationError
from mkdocs.structure.files import File

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docsgen.pages import Generated, api_nav, catalogue_nav, generate  # noqa: E402
from docsgen.plugin_scope import load_plugins  # noqa: E402

log = logging.getLogger("mkdocs.plugins.specformer_docs")

#: Written by other work streams; shown in the navigation only once the file exists.
OPTIONAL_PAGES = {"generation.md", "training.md", "interop.md", "components-guide.md", "benchmarks.md"}
#: Nav entries that expand into one page per registered kind / per core module.
EXPANDED = {"catalogue/index.md": catalogue_nav, "api/index.md": api_nav}

_generated: Generated | None = None


def _fit_nav(items: list, docs_dir: Path) -> list:
    out = []
    for item in items:
        title, target = next(iter(item.items())) if isinstance(item, dict) else (None, item)
        if isinstance(target, list):
            out.append({title: _fit_nav(target, docs_dir)})
            continue
        if target in OPTIONAL_PAGES and not (docs_dir / target).is_file():
            continue
        if target in EXPANDED:
            out.append({title: EXPANDED[target]()})
            continue
        out.append(item)
    return out


def on_config(config, **kwargs):
    global _generated
    try:
        documented = load_plugins(str(config.extra.get("specformer_plugins", "builtin")))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from exc
    log.debug("documenting plugins: %s", ", ".join(documented))
    _generated = generate()
    if config.nav:
        config.nav = _fit_nav(config.nav, Path(config.docs_dir))
    return config


def on_files(files, config, **kwargs):
    assert _generated is not None
    for problem in _generated.snippet_errors():
        log.warning("component catalogue: a snippet does not validate: %s", problem)
    for path, content in _generated.pages.items():
        if files.get_file_from_path(path) is not None:
            log.warning("generated page %s also exists in docs/; the generated one wins", path)
            files.remove(files.get_file_from_path(path))
        files.append(File.generated(config, path, content=content))
    return files

