"""Block layouts: how norms, token mixer and feed-forward are wired around the residual stream.

A layout component receives the block's ``mixer`` and ``ffn`` modules and a
``make_norm()`` that builds one norm of the spec's kind each time it is called; it
returns the block module, whose ``forward(x, ctx)`` maps the residual stream to the
next. Blocks expose ``mixer`` and ``ffn`` attributes.
"""
