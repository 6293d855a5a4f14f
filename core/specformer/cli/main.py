"""The ``specformer`` command. Core subcommands live here; plugins add theirs through
``specformer_register_commands``.

A user's mistake (:class:`~specformer.errors.UserError`) prints one clear message and
exits with code 2, without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from specformer.cli import scaffold
from specformer.cli.catalogue import components_json, format_components
from specformer.errors import RegistryError, SpecError, UserError
from specformer.files.outputs import write_text_output
from specformer.machine.allocation import allocation_failure_message, is_allocation_failure
from specformer.messages import plural, unknown_message
from specformer.registry.discovery import get_plugin_manager, get_registry, plugin_infos
from specformer.registry.schema import spec_json_schema
from specformer.spec import load_spec
from specformer.renamed import current_kind
from specformer.version import __version__

# Modules that import torch are imported inside the commands that need them (marked
# "late"), so that `specformer --help`, `components`, `schema` and `plugins` start
# without importing torch.


@dataclass
class Command:
    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: "Callable[[argparse.Namespace], int | None] | str"
    plugin: str


class Commands:
    """What ``specformer_register_commands`` receives: ``commands.add(name, help=, configure=, run=)``."""

    def __init__(self) -> None:
        self.by_name: dict[str, Command] = {}
        self._plugin = "core"

    def add(
        self,
        name: str,
        *,
        help: str,
        configure: Callable[[argparse.ArgumentParser], None],
        run: "Callable[[argparse.Namespace], int | None] | str",
    ) -> None:
        """Add a command; ``run`` may be ``"package.module:function"``, imported only when the command runs.

        ``configure`` builds the command's parser and runs for every ``--help``, so its module
        should import nothing heavy; a ``run`` given by path keeps torch out of start-up.
        """
        if name in self.by_name:
            raise RegistryError(
                f"plugin {self._plugin!r} adds command {name!r}, already added by plugin {self.by_name[name].plugin!r}"
            )
        if isinstance(run, str) and not re.fullmatch(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*", run):
            raise RegistryError(f"plugin {self._plugin!r} adds command {name!r} with run={run!r}: "
                                "give a function or 'package.module:function'")
        self.by_name[name] = Command(name, help, configure, run, self._plugin)


def _resolved(run: "Callable[[argparse.Namespace], int | None] | str") -> Callable[[argparse.Namespace], int | None]:
    if not isinstance(run, str):
        return run
    module, _, function = run.partition(":")
    return getattr(importlib.import_module(module), function)


class _Parser(argparse.ArgumentParser):
    """argparse exits with 2 on bad flags already; keep its message to one line plus usage."""


def make_parser() -> tuple[argparse.ArgumentParser, Commands]:

    parser = _Parser(
        prog="specformer",
        description="Build, inspect, train and sample decoder-only transformers from spec files.",
    )
    parser.add_argument("--version", action="version", version=f"specformer {__version__}")
    parser.add_argument(
        "--max-memory", metavar="SIZE", dest="global_max_memory",
        help="largest model to build or load, e.g. 64G or 'unlimited' (default: the memory available; "
             "same as SPECFORMER_MAX_MEMORY)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands = Commands()
    _core_commands(commands)
    pm = get_plugin_manager()
    for impl in pm.hook.specformer_register_commands.get_hookimpls():
        commands._plugin = impl.plugin_name
        impl.function(commands=commands)
    for command in commands.by_name.values():
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.configure(p)
        p.set_defaults(_run=command.run)
    return parser, commands


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; the exit code is 0, 2 for a user's mistake, 130 for Ctrl-C, 141 for a closed pipe.

    Ctrl-C at any point (plugins still importing, a spec being read) prints one line;
    ``specformer summary ... | head`` ends quietly when ``head`` stops reading.
    """
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at exit: a closed pipe is noticed while it can still be handled
        return code
    except KeyboardInterrupt:
        print("specformer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        _discard_stdout()  # the reader is gone; Python's final flush must not fail again
        return 141


def _main(argv: Sequence[str] | None) -> int:
    try:
        parser, _ = make_parser()
    except RegistryError as exc:
        print(f"specformer: plugin error: {exc}", file=sys.stderr)
        return 2
    except UserError as exc:  # SPECFORMER_PLUGINS, read as the plugins load
        print(f"error: {exc}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        _apply_max_memory(args.global_max_memory)
        return int(_resolved(args._run)(args) or 0)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RegistryError as exc:
        print(f"plugin error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        raise
    except OSError as exc:
        # A file the user named cannot be read or written (missing folder, permissions, disk full).
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:
        # The memory checks refuse what their estimates say will not fit; an allocation that fails anyway (the
        # estimate counts only big buffers, or --max-memory unlimited) is still the user's size, not a crash.
        if not is_allocation_failure(exc):
            raise
        print(f"error: {allocation_failure_message(exc, command=args.command)}", file=sys.stderr)
        return 2


def _apply_max_memory(value: str | None) -> None:
    """``--max-memory SIZE`` is ``SPECFORMER_MAX_MEMORY=SIZE`` for this run (checked here, once)."""
    if value is None:
        return
    from specformer.machine.memory import ENV_VAR, parse_bytes  # late: imports torch

    parse_bytes(value)  # InputError naming the bad value
    os.environ[ENV_VAR] = value


def _discard_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (captured in tests): nothing will flush to a closed pipe


# -- core commands ---------------------------------------------------------------------


def _core_commands(commands: Commands) -> None:
    commands.add("validate", help="Check spec files against the registry; exit 2 listing every problem.",
                 configure=_configure_validate, run=_run_validate)
    commands.add("summary", help="Parameters per component, FLOPs per token and KV-cache size of a spec.",
                 configure=_configure_summary, run=_run_summary)
    commands.add("components", help="List registered components with their plugin, doc and params.",
                 configure=_configure_components, run=_run_components)
    commands.add("plugins", help="List loaded plugins and where they came from.",
                 configure=lambda p: None, run=_run_plugins)
    commands.add("schema", help="Print the JSON Schema of a spec (every registered component included).",
                 configure=_configure_schema, run=_run_schema)
    commands.add("new-plugin", help=scaffold.HELP, configure=scaffold.configure, run=scaffold.run)


def _configure_validate(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (.yaml, .yml, .json, .toml)")


def _run_validate(args: argparse.Namespace) -> int:

    failed = False
    for path in args.specs:
        try:
            load_spec(path)
            print(f"{path}: ok")
        except SpecError as exc:
            failed = True
            print(str(exc), file=sys.stderr)
    return 2 if failed else 0


def _configure_summary(p: argparse.ArgumentParser) -> None:
    p.add_argument("spec", metavar="SPEC", help="a spec file, or a .safetensors checkpoint (a run's step-N directory "
                                                  "or a run directory: its latest checkpoint)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--parallel", metavar="AXES",
                   help="also plan a layout on paper, e.g. tp=8,ep=8,dp_shard=16 (axes: tp, ep, dp_shard, "
                        "dp_replicate): memory and communication per device")
    p.add_argument("--dtype", choices=("bf16", "fp32"),
                   help="training precision for --parallel (default: the spec's train.precision, else bf16)")
    p.add_argument("--batch", type=int, default=1, help="sequences per data-parallel rank for --parallel (default 1)")
    p.add_argument("--seq", type=int, help="tokens per sequence for --parallel (default: the context length)")


def _run_summary(args: argparse.Namespace) -> int:
    from specformer.model.summary import format_summary, summarize  # late: imports torch

    layout = _parallel_layout(args)  # bad --parallel values are refused before the spec is read
    spec = _spec_from_file_or_checkpoint(args.spec)
    s = summarize(spec)
    stored = _stored_weight_bytes(args.spec)
    plan = _parallel_report(spec, layout, args) if layout is not None else None
    if args.json:
        print(json.dumps({**s.to_dict(), **({"weight_bytes": stored} if stored is not None else {}),
                          **({"parallel": plan.to_dict()} if plan is not None else {})}, indent=2))
    else:
        print(format_summary(s, title=args.spec))
        if stored is not None:  # a checkpoint: what its weights take as stored (quantized ones included)
            print(f"weights in the file: {stored:,} bytes")
        if plan is not None:
            from specformer.model.device_plan import format_parallel

            print(format_parallel(plan))
    return 0


def _parallel_layout(args: argparse.Namespace) -> Any:
    for flag, value in (("--batch", args.batch), ("--seq", args.seq)):
        if value is not None and value < 1:
            raise UserError(f"{flag} must be at least 1, not {value}")
    if args.parallel is None:
        if args.dtype is not None or args.seq is not None or args.batch != 1:
            raise UserError("--dtype, --batch and --seq size the --parallel plan; give --parallel too")
        return None
    from specformer.model.device_plan import parse_layout  # late: imports torch

    return parse_layout(args.parallel)


def _parallel_report(spec: Any, layout: Any, args: argparse.Namespace) -> Any:
    """The plan on paper; the precision from --dtype, else the spec's train section (auto: bf16), else bf16."""
    from specformer.model.device_plan import plan_parallel
    from specformer.spec.check import estimate

    dtype, source = args.dtype, "--dtype"
    if dtype is None:
        train = spec.section("train")
        precision = train.get("precision") if isinstance(train, dict) else getattr(train, "precision", None)
        dtype, source = ("fp32", "the spec's train.precision") if precision == "fp32" else (
            ("bf16", "the spec's train.precision") if precision in ("bf16", "auto") else ("bf16", "the default"))
        if precision == "auto":
            source = "the spec's train.precision (auto: bf16 on accelerators)"
    return plan_parallel(estimate(spec), layout, dtype=dtype, dtype_source=source, batch=args.batch, seq=args.seq)


def _is_checkpoint(path: str) -> bool:
    """A checkpoint file, or a directory standing for one (a run's step-N directory, a run directory)."""
    return path.endswith(".safetensors") or os.path.isdir(path)


def _stored_weight_bytes(path: str) -> int | None:
    from specformer.checkpoint.check import check_checkpoint  # late: imports torch

    return check_checkpoint(path).stored_bytes if _is_checkpoint(path) else None


def _spec_from_file_or_checkpoint(path: str) -> Any:
    """A spec file's spec, or a checkpoint's, checked against the checkpoint's own tensors (nothing loaded)."""
    from specformer.checkpoint.check import check_checkpoint  # late: imports torch

    if _is_checkpoint(path):
        return check_checkpoint(path).spec
    return load_spec(path)


def _configure_components(p: argparse.ArgumentParser) -> None:
    p.add_argument("kind", nargs="?", help="only this kind (positional, norm, ffn, mixer, layout, sampler, ...)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _run_components(args: argparse.Namespace) -> int:

    registry = get_registry()
    if args.kind:  # the kind a name had before a rename lists what it is called now
        args.kind = current_kind(args.kind, where="specformer components")
    if args.kind and args.kind not in registry.kinds:
        raise UserError(unknown_message("kind", args.kind, sorted(registry.kinds), accepted="known kinds"))
    chosen = [c for c in registry if not args.kind or c.kind == args.kind]
    print(json.dumps(components_json(chosen), indent=2) if args.json else format_components(chosen))
    return 0


def _run_plugins(args: argparse.Namespace) -> int:

    registry = get_registry()
    for info in plugin_infos():
        count = sum(1 for c in registry if c.plugin == info.name)
        print(f"{info.name:<12} {info.distribution} {info.version}  module {info.module}  ({plural(count, 'component')})")
        if info.file:
            print(f"{'':<12} {info.file}")
    return 0


def _configure_schema(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--force", action="store_true", help="replace the -o file if it exists")


def _run_schema(args: argparse.Namespace) -> int:

    text = json.dumps(spec_json_schema(get_registry()), indent=2)
    if args.output:
        write_text_output(args.output, text + "\n", force=args.force)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
