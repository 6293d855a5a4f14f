"""The model runtime: from a validated spec to a running :class:`~specformer.model.decoder.Decoder`.

- :mod:`specformer.model.positional`, :mod:`specformer.model.attention`: what other code may know
  about a positional scheme and an attention layer (the contracts components implement);
- :mod:`specformer.model.masks`, :mod:`specformer.model.context`: which keys a query may read, and
  what a forward pass hands every block (the KV-cache contract);
- :mod:`specformer.model.decoder`: embed -> positional -> blocks -> final norm -> LM head;
- :mod:`specformer.model.sized`: what a component's size check answers (declared on its ``Params``),
  and :mod:`specformer.model.sized_by_building` for a component that declares none;
- :mod:`specformer.model.wiring`: which sizes each part receives, written once for building and checking;
- :mod:`specformer.model.assemble`: the modules of a resolved model, wired together;
- :mod:`specformer.model.sizes`: shapes on the meta device (memory estimates, ``summary``);
- :mod:`specformer.model.builder`: :func:`specformer.build`;
- :mod:`specformer.model.summary`: sizes and costs of a spec'd model.
"""
