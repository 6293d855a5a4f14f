"""The version of specformer (one place: the package, checkpoints and scaffolds read it here)."""

__version__ = "0.1.0"
