"""Every hook a specformer plugin can implement.

A plugin is a module (or object) with functions named like the specs below, marked
with :data:`hookimpl`, and declared in its package's ``pyproject.toml``::

    [project.entry-points.specformer]
    myplugin = "my_package.plugin"

The built-in plugins (layers, generate, train, hf) are registered exactly this way.

The core declares only the hooks every plugin may need (components, commands, spec
checks) and the two through which a plugin brings extension points of its own, as
pytest's ``pytest_addhooks`` does: :func:`specformer_add_hookspecs` for hooks other
plugins implement, :func:`specformer_add_kinds` for registry kinds other plugins fill.
"""

from __future__ import annotations

from typing import Any

import pluggy

from specformer.registry.components import PluginRegistry
from specformer.spec.shapes import Spec

PROJECT = "specformer"

hookspec = pluggy.HookspecMarker(PROJECT)
#: Decorate a plugin's hook implementations with this.
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(historic=True)
def specformer_add_hookspecs(pluginmanager: pluggy.PluginManager) -> None:
    """Add this plugin's own hook specifications, for other plugins to implement.

    Called as soon as the plugin is registered (before any other hook of it), like
    pytest's ``pytest_addhooks``::

        from my_plugin import hookspecs      # a module of functions marked with specformer's hookspec

        @hookimpl
        def specformer_add_hookspecs(pluginmanager):
            pluginmanager.add_hookspecs(hookspecs)

    Another plugin's implementation of such a hook is checked against it once every
    plugin is loaded, whatever order they load in; a hook no plugin declared is a
    :class:`~specformer.errors.RegistryError` naming the plugin that implements it.
    """


@hookspec
def specformer_add_kinds(registry: "PluginRegistry") -> None:
    """Add the registry kinds this plugin owns: ``registry.add_kind(name, doc=..., sizes=(...))``.

    Called for every plugin before any ``specformer_register_components``, so another
    plugin can register components of this kind whatever order the plugins load in.
    ``sizes`` are the keyword arguments the kind's owner passes to each factory, after
    the params. Defining a kind another plugin defined differently raises
    :class:`~specformer.errors.RegistryError` naming the plugin.
    """


@hookspec
def specformer_register_components(registry: "PluginRegistry") -> None:
    """Add components or spec sections.

    Called once per plugin when the registry is first needed, with a view of the
    registry that records the plugin's name on everything it registers::

        registry.register("norm", "scalenorm", factory="my_plugin.norms:ScaleNorm", params=ScaleNormParams)
        registry.add_section("train", TrainSpec)   # a top-level spec section

    A factory given as ``"module:Name"`` is imported only when first built, so that listing
    components imports nothing heavy; its ``Params`` should live in a module that imports
    no torch. A name already taken, a Params model without ``extra="forbid"``, or a factory
    that cannot take the sizes of its kind raises :class:`~specformer.errors.RegistryError`
    naming the plugin.
    """


@hookspec
def specformer_register_commands(commands: "Any") -> None:
    """Add subcommands to the ``specformer`` command line.

    ``commands.add(name, help=..., configure=fn(parser), run=fn(args) -> int)``;
    ``configure`` receives an :class:`argparse.ArgumentParser` to add arguments to, and
    ``run`` receives the parsed arguments and returns the exit code. Raise
    :class:`~specformer.errors.UserError` for a user's mistake: the CLI prints its
    message and exits with code 2.
    """


@hookspec
def specformer_validate_spec(spec: "Spec", registry: Any) -> "list[Any] | None":
    """Cross-component checks a plugin knows about, run after a spec validated.

    Return a list of :class:`~specformer.errors.Problem` (or strings); an empty list or
    None means no problem.
    """


@hookspec(firstresult=True)
def specformer_checkpoint_layout(metadata: "dict[str, str]", tensors: "dict[str, Any]", where: str) -> "Any":
    """A plugin's stored layout (a quantized checkpoint): return the float layout it stands for, else None.

    ``tensors`` maps stored names to :class:`~specformer.checkpoint.check.TensorInfo`. A
    plugin that recognises ``metadata`` (its own header entry) returns the name -> TensorInfo
    the model's float ``state_dict`` would have, so the spec is checked against it; a stored
    layout it cannot account for raises :class:`~specformer.errors.CheckpointError`. The
    first non-None answer wins.
    """


@hookspec(firstresult=True)
def specformer_load_checkpoint(checked: "Any", device: "Any") -> "Any":
    """Load a checkpoint whose layout a plugin declared (see ``specformer_checkpoint_layout``); else None.

    ``checked`` is the :class:`~specformer.checkpoint.check.CheckedCheckpoint`; return the
    model on ``device``. The first non-None answer wins; None everywhere is the plain load.
    """
