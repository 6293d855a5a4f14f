"""Block layouts: how norms, attention and feed-forward are wired around the residual stream.

A layout component receives the block's ``attention`` and ``ffn`` modules and a
``make_norm()`` that builds one norm of the spec's kind each time it is called; it
returns the block module, whose ``forward(x, ctx)`` maps the residual stream to the
next. Blocks expose ``attention`` and ``ffn`` attributes.
"""
