"""specformer's built-in layers: positional schemes, norms, feed-forward networks,
attention and block layouts. A plugin like any other (see ``plugin.py``)."""
