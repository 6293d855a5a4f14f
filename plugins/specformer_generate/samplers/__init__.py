"""Sampler components: logits processors and choices, composed in a spec's ``generate.sampler`` list.

One sampler per module; their settings in :mod:`specformer_generate.samplers.params` (no torch),
the pipeline that runs them in :mod:`specformer_generate.samplers.pipeline`.
"""
