"""The settings of the built-in loggers (none yet), in a module that imports no torch.

Each model's docstring is the logger's description in the catalogue.
"""

from __future__ import annotations

from specformer.registry.params import Params


class JsonlParams(Params):
    """Metrics as JSON lines in metrics.jsonl (what resume, plots and the tests read), and loss.png."""


class TensorBoardParams(Params):
    """Scalars of every training step and evaluation, under train/ and eval/, in <out_dir>/tensorboard."""
