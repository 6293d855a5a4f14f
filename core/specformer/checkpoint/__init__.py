"""Checkpoints: one ``.safetensors`` file whose header metadata carries the spec.

- :mod:`specformer.checkpoint.file`: the file itself (format tag, metadata, tensors, atomic writes);
- :mod:`specformer.checkpoint.locate`: where a checkpoint lies (a file, a run's step-N directory, a run directory);
- :mod:`specformer.checkpoint.provenance`: which plugins made a checkpoint's components;
- :mod:`specformer.checkpoint.check`: a header checked against its spec before anything is allocated;
- :mod:`specformer.checkpoint.save_load`: :func:`specformer.save` and :func:`specformer.load`.
"""
