"""specformer's train plugin."""
