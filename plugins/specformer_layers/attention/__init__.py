"""Causal self-attention."""
