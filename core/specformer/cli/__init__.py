"""The ``specformer`` command: its parser, the core's subcommands, and what they print.

- :mod:`specformer.cli.main`: the parser, core subcommands and exit codes;
- :mod:`specformer.cli.catalogue`: the registry as text (``specformer components``);
- :mod:`specformer.cli.scaffold`: ``specformer new-plugin``.
"""
