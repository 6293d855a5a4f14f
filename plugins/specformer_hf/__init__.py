"""specformer's hf plugin."""
