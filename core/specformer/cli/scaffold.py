"""``specformer new-plugin NAME``: write a plugin package that installs and passes its own test.

The package has what every plugin needs and nothing else: a ``pyproject.toml`` declaring
the ``specformer`` entry point, a plugin module with the registration hook, one
component (a norm) with its ``Params`` model, and a test that finds the component
through the entry point, checks its formula and builds a model with it::

    specformer new-plugin mynorm
    pip install -e specformer-mynorm
    pytest specformer-mynorm/tests
"""

from __future__ import annotations

import argparse
import keyword
import re
from pathlib import Path
from string import Template

from specformer.errors import UserError
from specformer.files.outputs import staged_folder
from specformer.registry.discovery import get_plugin_manager, get_registry
from specformer.version import __version__

HELP = "Write a ready-to-install plugin package (entry point, one component with its Params, one test)."

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME",
                        help="plugin name: a lowercase Python identifier; also the name of the example norm")
    parser.add_argument("--dir", default=".", metavar="DIR",
                        help="where to create the package folder specformer-NAME (default: the current directory)")
    parser.add_argument("--force", action="store_true",
                        help="replace a folder specformer-NAME that already holds files (once the new one is complete)")


def run(args: argparse.Namespace) -> int:
    root = new_plugin(args.name, directory=Path(args.dir), force=args.force)
    print(f"created {root} (plugin {args.name!r}, package specformer_{args.name}, norm component {args.name!r})")
    print("next:")
    print(f"  pip install -e {root}")
    print(f"  pytest {root / 'tests'}")
    print("  specformer components norm")
    return 0


def check_name(name: str) -> None:
    """Raise :class:`UserError` unless ``name`` can be a new plugin and component name."""
    if not _NAME.match(name) or keyword.iskeyword(name):
        suggestion = re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_") or "my_plugin"
        if not suggestion[0].isalpha():
            suggestion = f"p_{suggestion}"
        raise UserError(
            f"plugin name {name!r} must be a lowercase Python identifier (letters, digits and '_', "
            f"starting with a letter, not a keyword), e.g. {suggestion!r}"
        )
    taken = sorted(n for n, _ in get_plugin_manager().list_name_plugin() if n)
    if name in taken:
        raise UserError(f"a plugin named {name!r} is already installed (installed plugins: {', '.join(taken)})")
    registry = get_registry()
    if name in registry.names("norm"):
        owner = registry.get("norm", name).plugin
        raise UserError(
            f"a norm named {name!r} is already registered by plugin {owner!r}; the example component "
            f"takes the plugin's name, so choose another name"
        )


def new_plugin(name: str, *, directory: Path | str = ".", force: bool = False) -> Path:
    """Create ``directory/specformer-<name>/`` (and ``directory`` if needed) and return its path.

    The folder is written whole or not at all (:mod:`specformer.files.outputs`); one that already
    holds files is refused, or with ``force`` replaced once the new one is complete.
    """
    check_name(name)
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise UserError(f"--dir {str(directory)!r} is a file, not a directory")
    root = directory / f"specformer-{name.replace('_', '-')}"
    values = {
        "name": name,
        "package": f"specformer_{name}",
        "dist": f"specformer-{name.replace('_', '-')}",
        "cls": "".join(part.capitalize() for part in name.split("_") if part),
        "specformer_version": _version(),
    }
    files = {
        "pyproject.toml": _PYPROJECT,
        "README.md": _README,
        f"src/{values['package']}/__init__.py": _INIT,
        f"src/{values['package']}/plugin.py": _PLUGIN,
        f"src/{values['package']}/params.py": _PARAMS,
        f"src/{values['package']}/norm.py": _NORM,
        f"tests/test_{name}.py": _TEST,
    }
    with staged_folder(root, force=force, parents=True) as stage:
        for relative, template in files.items():
            path = stage / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(Template(template).substitute(values), encoding="utf-8")
    return root


def _version() -> str:
    return __version__


_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "A specformer plugin."
requires-python = ">=3.10"
dependencies = ["specformer>=$specformer_version"]

# specformer loads every entry point of the group "specformer": the name is the plugin's name.
[project.entry-points.specformer]
$name = "$package.plugin"

[tool.setuptools.packages.find]
where = ["src"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

_README = """\
# $dist

A specformer plugin. It registers the norm `$name`.

```bash
pip install -e .
specformer components norm     # lists $name, registered by plugin "$name"
pytest
```

Use it in a spec:

```yaml
model:
  block:
    norm: {kind: $name, eps: 1.0e-6}
```
"""

_INIT = '''\
"""The $name specformer plugin.

``$cls`` is imported on first use: specformer imports this package for its entry point
whenever it lists components, and that must not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["$cls"]


def __getattr__(name: str) -> Any:
    if name == "$cls":
        return importlib.import_module("$package.norm").$cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
'''

_PLUGIN = '''\
"""The module the entry point names: specformer calls the hooks defined here."""

from __future__ import annotations

from specformer.registry.hookspecs import hookimpl
from specformer.registry.components import PluginRegistry
from $package.params import ${cls}Params


@hookimpl
def specformer_register_components(registry: PluginRegistry) -> None:
    # The class is named by its path, so listing components imports only params.py, never
    # torch; the registry checks here that the Params forbid unknown keys, naming this plugin.
    registry.register("norm", "$name", factory="$package.norm:$cls", params=${cls}Params)
'''

_PARAMS = '''\
"""The settings of the $name norm, in a module that imports no torch (listing components reads only this)."""

from __future__ import annotations

from pydantic import Field

from specformer.registry.params import Params


class ${cls}Params(Params):
    """Divide each vector by its root mean square, then scale per channel: ``x / sqrt(mean(x^2) + eps) * weight``."""

    eps: float = Field(default=1e-6, gt=0, description="Added to the mean square for stability.")
'''

_NORM = '''\
"""The $name norm: replace the formula with your idea."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from $package.params import ${cls}Params


class $cls(nn.Module):
    """The $name norm over the last ``dim`` channels; what it computes and its settings: ``${cls}Params``."""

    Params = ${cls}Params

    def __init__(self, params: ${cls}Params | None = None, *, dim: int) -> None:
        super().__init__()
        params = params if params is not None else ${cls}Params()
        self.eps = params.eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight

    def init_weights(self, *, std: float, residual_std: float) -> None:
        nn.init.ones_(self.weight)
'''

_TEST = '''\
"""The $name plugin: found through its entry point, correct, usable in a spec."""

from __future__ import annotations

import pytest
import torch

import specformer
from $package import $cls

SPEC = {
    "model": {
        "vocab_size": 64,
        "d_model": 32,
        "n_layers": 2,
        "context_length": 16,
        "positional": "rope",
        "block": {
            "norm": {"kind": "$name", "eps": 1e-5},
            "mixer": {"kind": "attention", "n_heads": 4},
            "ffn": "swiglu",
        },
    }
}


def test_registered_through_the_entry_point():
    component = specformer.get_registry().get("norm", "$name")
    assert component.plugin == "$name"
    assert component.params is $cls.Params


def test_formula():
    norm = $cls($cls.Params(eps=1e-5), dim=8)
    with torch.no_grad():
        norm.weight.copy_(torch.arange(1.0, 9.0))
    x = torch.randn(2, 3, 8)
    expected = x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + 1e-5) * torch.arange(1.0, 9.0)
    torch.testing.assert_close(norm(x), expected)


def test_builds_and_trains_in_a_model():
    model = specformer.build(SPEC, seed=0)
    assert any(isinstance(m, $cls) for m in model.modules())
    ids = torch.randint(0, 64, (2, 16))
    logits = model(ids)
    assert logits.shape == (2, 16, 64)
    logits.sum().backward()


def test_bad_params_name_the_field():
    spec = {"model": {**SPEC["model"], "block": {**SPEC["model"]["block"], "norm": {"kind": "$name", "eps": -1}}}}
    with pytest.raises(specformer.SpecError, match=r"model\\.block\\.norm\\.eps"):
        specformer.load_spec(spec)
'''

