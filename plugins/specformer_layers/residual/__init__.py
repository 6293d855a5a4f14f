"""Residual streams: the one stream every layout adds to, and manifold-constrained hyper-connections (several)."""
