"""specformer's generate plugin."""
