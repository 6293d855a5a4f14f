"""``python -m specformer.cli``: the same as the ``specformer`` command."""

from specformer.cli.main import main

raise SystemExit(main())
