"""Positional schemes: how token positions enter the model."""
