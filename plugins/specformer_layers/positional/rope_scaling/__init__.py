"""RoPE scaling: how a rotary scheme changes its frequencies to reach past its trained context.

A kind of its own (``rope_scaling``), named by ``rope``'s ``scaling`` param::

    positional: {kind: rope, theta: 500000, scaling: {kind: llama3, factor: 32}}

Each component receives ``rotary_dim`` (the rotated channels of a head), ``theta`` and
the model's ``context_length`` and returns a :class:`~.base.RopeScaling`.
"""
